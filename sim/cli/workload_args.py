"""The workload a `python -m sim run` command line names: what the shared workload options
select (a trace or the shared-prefix workload, window, time scale, arrivals), capped at the
model's context, and deadlines for edf."""
from __future__ import annotations

import argparse
import math

from paged.workloads.options import workload_from_args
from paged.workloads.workload import Workload

from ..models import get_model
from ..sim_config import SimConfig


def workload_for_run(args: argparse.Namespace, config: SimConfig) -> Workload:
    """The options' workload (`paged.workloads.options`), capped at the model's context, with
    deadlines from the SLOs when the edf policy needs them and the trace has none."""
    workload = workload_from_args(args, config.max_model_len or get_model(config.model).max_model_len,
                                  config.block_size)
    if config.policy == "edf" and workload.deadline_s is None:
        if args.slo_ttft_s is None and args.slo_tpot_s is None:
            raise ValueError(f"policy edf needs deadlines, and {workload.name} has no slo_s column: give --slo-ttft-s "
                             "and/or --slo-tpot-s (deadline = arrival + TTFT + TPOT * (output tokens - 1))")
        workload = workload.with_slo_deadlines(*(math.inf if v is None else v
                                                 for v in (args.slo_ttft_s, args.slo_tpot_s)))
    return workload
