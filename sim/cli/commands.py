"""The subcommands of `python -m sim`: run, demo, fit, list (bench lives in `sim.bench`)."""
from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import warnings
from pathlib import Path

from paged.metrics_summary import format_summary, jsonable
from paged.workloads.traces import AZURE_CONV

from ..gpu_cost import is_gpu_cost_model
from ..sim_config import ROUTERS, SimConfig
from .options import sim_config
from .outputs import check_output_paths, files_line, write_outputs
from .workload_args import workload_for_run

CACHE_ROUTERS = ("prefix_aware", "kv_aware")  # routers that read a prompt's prefix ids


def cmd_run(args: argparse.Namespace) -> int:
    from ..runner import simulate

    check_output_paths(args)
    config = sim_config(args)
    workload = workload_for_run(args, config)
    profile_file = (isinstance(config.cost_model, str) and config.cost_model != "roofline"
                    and not is_gpu_cost_model(config.cost_model))
    if profile_file and Path(config.cost_model).is_file():  # else: its error alone
        from ..profiled import mismatch_warning

        if note := mismatch_warning(config.cost_model, config.model, config.num_gpu_blocks, config.hardware):
            print(f"warning: {note}", file=sys.stderr)
    if config.router in CACHE_ROUTERS and config.replicas > 1 and workload.prefix_index is None:
        print(f"warning: --router {config.router} matches prompts by their prefix ids, and {workload.name} has "
              "none (its rows give lengths only): every request is routed by load, and no prompt shares a cached "
              "block (a trace with hash ids, such as Mooncake's, or --shared-prefix has them)", file=sys.stderr)
    if args.progress_bar and len(workload) >= 20_000:
        config.progress = True
    # One run, then the process exits: what start-up built (modules, the workload) lives until then.
    # Frozen, the collector never traverses it again: a run's full collection and the one at exit
    # each went over all of it (~1% of an Azure conversation run).
    gc.freeze()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        result = simulate(workload, config)
    gc.freeze()  # the same for what the run leaves (its schedulers' blocks, the result): the exit's collection skips it
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    summary = result.summary()
    if args.slo_ttft_s is not None or args.slo_tpot_s is not None:
        summary["goodput"] = result.goodput(args.slo_ttft_s if args.slo_ttft_s is not None else math.inf,
                                            args.slo_tpot_s if args.slo_tpot_s is not None else math.inf)
    summary = with_yardstick(summary, workload, config)
    print(format_summary(summary))
    write_outputs(args, result, summary, workload, config)
    if line := files_line(args):
        print(line)
    return 0


def with_yardstick(summary: dict, workload, config: SimConfig) -> dict:
    """`summary` with `pooled_lru_hit_rate` after `prefix_cache_hit_rate` where there is routing to
    judge (replicas, prompts with prefix ids, prefix caching on): the hit rate of one LRU cache as
    large as all the replicas' caches together, over the trace in arrival order (the yardstick of
    `paged.workloads.prefix_reuse`), so that a router's hit rate is read beside what routing aims at."""
    if config.replicas < 2 or workload.prefix_index is None or not config.enable_prefix_caching:
        return summary
    from paged.workloads.prefix_reuse import pooled_lru_hit_rate

    bound = pooled_lru_hit_rate(workload, summary["num_gpu_blocks"] * config.replicas, config.block_size)
    out = {}
    for k, v in summary.items():
        out[k] = v
        if k == "prefix_cache_hit_rate":
            out["pooled_lru_hit_rate"] = bound
    return out


def cmd_demo(args: argparse.Namespace) -> int:
    from paged.workloads.workload import load_workload

    from ..models import get_model
    from ..runner import simulate

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: is a file; expected a folder for demo.png and summary.json")
    out.mkdir(parents=True, exist_ok=True)
    config = SimConfig(model="llama-2-7b", hardware="a100-80gb")
    max_len = get_model(config.model).max_model_len
    workload = load_workload(AZURE_CONV, num_requests=args.num_requests, max_model_len=max_len)
    print(f"Replaying {len(workload):,} requests of {AZURE_CONV.name} on {config.model} / {config.hardware}; "
          f"{workload.num_capped:,} of them, longer than its {max_len:,}-token context, cut to fit (num_capped) ...")
    result = simulate(workload, config)
    summary = result.summary()
    print(format_summary(summary))
    result.plot(out / "demo.png")
    (out / "summary.json").write_text(json.dumps(jsonable({**summary, "config": config.to_dict()}), indent=2) + "\n")
    print(f"\n{summary['num_requests']:,} requests, {summary['simulated_time_s']:,.0f} s simulated in "
          f"{summary['wall_time_s']:.2f} s wall: {summary['sim_requests_per_wall_s']:,.0f} simulated requests/s")
    print(f"figure: {out / 'demo.png'}; summary: {out / 'summary.json'}")
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from ..profiled import fit_profile

    fit = fit_profile(args.profile)
    print(fit.cost_model.description)
    for k, v in fit.coefficients_s.items():
        print(f"  {k:<26} {v:.4g} s")
    return 0


def cmd_list(_args: argparse.Namespace) -> int:
    from paged.core.policies import POLICIES
    from paged.workloads.traces import FORMATS

    from ..hardware import HARDWARE
    from ..models import KV_DTYPES, MODELS

    for title, names in (("models", MODELS), ("hardware", HARDWARE), ("routers", ROUTERS), ("policies", POLICIES),
                         ("kv cache dtypes", KV_DTYPES), ("trace formats", FORMATS)):
        print(f"{title}: {', '.join(names)}")
    return 0
