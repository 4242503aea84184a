"""The workload a `python -m sim run` command line names: a trace, or the synthetic shared-prefix
workload, with the window, time scale, arrivals, length cap and (for edf) deadlines it asks for."""
from __future__ import annotations

import argparse
import math

from paged.workloads.workload import Workload, load_workload, select, shared_prefix_workload

from ..models import get_model
from ..sim_config import SimConfig


def workload_from_args(args: argparse.Namespace, config: SimConfig) -> Workload:
    if (args.trace is None) == (args.shared_prefix is None):
        raise ValueError("run: give --trace PATH or --shared-prefix G,P,S,O (or `trace:` in --config), not both")
    max_len = config.max_model_len or get_model(config.model).max_model_len
    if args.shared_prefix is not None:
        if args.num_requests is None or args.rate is None:
            raise ValueError("--shared-prefix needs --num-requests and --rate (synthetic arrivals)")
        if args.num_requests < 1:
            raise ValueError(f"num_requests={args.num_requests}: expected >= 1")
        if args.start_s or args.duration_s is not None:
            raise ValueError("--start-s/--duration-s select a window of a trace; a --shared-prefix workload is "
                             "sized by --num-requests")
        groups, prefix, suffix, output = args.shared_prefix
        generated = shared_prefix_workload(args.num_requests, groups, prefix, suffix, output, args.rate, args.arrival,
                                           args.cv, args.seed, hash_id_block_size=config.block_size)
        workload = select(generated, time_scale=args.time_scale, max_model_len=max_len if args.cap_lengths else None)
    else:
        workload = load_workload(args.trace, args.format, num_requests=args.num_requests, start_s=args.start_s,
                                 duration_s=args.duration_s, time_scale=args.time_scale, arrival=args.arrival,
                                 rate=args.rate, cv=args.cv, seed=args.seed,
                                 max_model_len=max_len if args.cap_lengths else None)
    if config.policy == "edf" and workload.deadline_s is None:
        if args.slo_ttft_s is None and args.slo_tpot_s is None:
            raise ValueError(f"policy edf needs deadlines, and {workload.name} has no slo_s column: give --slo-ttft-s "
                             "and/or --slo-tpot-s (deadline = arrival + TTFT + TPOT * (output tokens - 1))")
        workload = workload.with_slo_deadlines(*(math.inf if v is None else v
                                                 for v in (args.slo_ttft_s, args.slo_tpot_s)))
    return workload
