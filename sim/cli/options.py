"""The command line's options, grouped as the docs group them, and the parser built from them.

The workload's options are `paged.workloads.options`' (the load generator takes the same); the
option `dest`s are SimConfig's field names and the workload's keys, so that a YAML config
file (`sim.cli.yaml_config`) holds the same names as the command line.
"""
from __future__ import annotations

import argparse

from paged.workloads.options import add_workload_options, numbers
from paged.workloads.traces import REPO

from .. import breakdown, calibrate_cmd
from ..sim_config import ROUTERS, SimConfig
from .search_command import add_search_parser

OUTPUT_KEYS = ("json", "requests_csv", "timeseries_csv", "plot", "slo_ttft_s", "slo_tpot_s", "progress_bar")


def add_sim_options(p: argparse.ArgumentParser) -> None:
    d = SimConfig()
    g = p.add_argument_group("deployment")
    g.add_argument("--model", default=d.model)
    g.add_argument("--hardware", default=d.hardware)
    g.add_argument("--tp", type=int, default=d.tp, help="tensor-parallel GPUs per replica")
    g.add_argument("--replicas", type=int, default=d.replicas)
    g.add_argument("--router", default=d.router, choices=ROUTERS)
    g = p.add_argument_group("KV cache")
    g.add_argument("--block-size", type=int, default=d.block_size)
    g.add_argument("--kv-cache-dtype", default=d.kv_cache_dtype, choices=("fp16", "fp8", "int8", "int4"))
    g.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization)
    g.add_argument("--num-gpu-blocks", type=int, default=d.num_gpu_blocks, help="override what memory leaves")
    g.add_argument("--swap-space-gib", type=float, default=d.swap_space_gib)
    g.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false")
    g.add_argument("--watermark", type=float, default=d.watermark)
    g = p.add_argument_group("scheduler")
    g.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    g.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    g.add_argument("--max-model-len", type=int, default=d.max_model_len, help="default: the model's context")
    g.add_argument("--no-chunked-prefill", dest="enable_chunked_prefill", action="store_false")
    g.add_argument("--long-prefill-token-threshold", type=int, default=d.long_prefill_token_threshold)
    g.add_argument("--policy", default=d.policy,
                   help="fcfs | priority | sjf | edf | lpm. priority reads the trace's optional priority and "
                        "business_value columns; edf serves by deadline: the trace's slo_s column, else "
                        "arrival + --slo-ttft-s + --slo-tpot-s * (output tokens - 1); sjf ranks by prompt + "
                        "max_tokens, which on a trace is the true output length (an oracle)")
    g.add_argument("--priority-weights", type=weights, default=d.priority_weights, metavar="A,B,C",
                   help="priority's P = A*wait_time + B*expected_tokens + C*business_value (default 1,0,1)")
    g.add_argument("--preemption", default=d.preemption, choices=("recompute", "swap"))
    g.add_argument("--static-batching", action="store_true", help="the traditional baseline instead of paging")
    g.add_argument("--static-batch-size", type=int, default=d.static_batch_size)
    g.add_argument("--batch-timeout-s", type=float, default=d.batch_timeout_s)
    g.add_argument("--static-reserve", choices=["max_model_len", "max_tokens"], default=d.static_reserve,
                   help="KV a static batch reserves per request")
    g = p.add_argument_group("cost model")
    g.add_argument("--cost-model", default=d.cost_model,
                   help="calibrated (fitted to measured GPU profiles), vidur:DIR (Vidur's measured mlp.csv profiles "
                        "under DIR), roofline, or a paged-step-profile/1 JSON file")
    g.add_argument("--mfu-efficiency", type=float, default=d.mfu_efficiency, help="roofline only")
    g.add_argument("--bandwidth-efficiency", type=float, default=d.bandwidth_efficiency, help="roofline only")
    g.add_argument("--step-overhead-s", type=float, default=d.step_overhead_s)
    g = p.add_argument_group("simulator")
    g.add_argument("--no-fast-path", dest="fast_path", action="store_false", help="step one iteration at a time")
    g.add_argument("--record-itl", action="store_true",
                   help="keep every inter-token latency of every request (the itl_s column of --requests-csv)")
    g.add_argument("--timeseries-interval-s", type=float, default=None)


def weights(text: str) -> tuple[float, float, float]:
    return numbers(text, "A,B,C")


def add_output_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--json", default=None, help="write the summary (and config) as one JSON object")
    g.add_argument("--requests-csv", default=None, help="write the per-request records")
    g.add_argument("--timeseries-csv", default=None)
    g.add_argument("--plot", default=None, help="write the latency CDF / KV usage figure (PNG)")
    g.add_argument("--slo-ttft-s", type=float, default=None, help="goodput: TTFT target")
    g.add_argument("--slo-tpot-s", type=float, default=None, help="goodput: TPOT target")
    g.add_argument("--no-progress", dest="progress_bar", action="store_false")


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The parser, and its `run` subparser (whose defaults a --config file replaces)."""
    parser = argparse.ArgumentParser(prog="python -m sim", description="Simulate paged-KV serving.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="simulate a trace")
    run.add_argument("--config", default=None, help="YAML file with the same options")
    add_workload_options(run)
    add_sim_options(run)
    add_output_options(run)
    demo = sub.add_parser("demo", help="the Azure conversation trace on Llama-2-7B / A100-80GB, with a figure")
    demo.add_argument("--out", default=str(REPO / "experiments" / "results" / "demo"))
    demo.add_argument("--num-requests", type=int, default=None)
    fit = sub.add_parser("fit", help="fit a cost model to a step profile and report its error")
    fit.add_argument("profile")
    calibrate_cmd.add_parser(sub)
    breakdown.add_parser(sub)
    add_search_parser(sub)
    sub.add_parser("list", help="known models, hardware, routers, policies, trace formats")
    sub.add_parser("bench", help="simulated requests per wall second and peak memory (see sim.bench)",
                   add_help=False)
    return parser, run


def sim_config(args: argparse.Namespace) -> SimConfig:
    return SimConfig(**{k: getattr(args, k) for k in SimConfig.field_names() if hasattr(args, k)})
