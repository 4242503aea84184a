"""The command line's options, grouped as the docs group them, and the parser built from them.

The workload's options are `paged.workloads.options`' (the load generator takes the same); the
option `dest`s are SimConfig's field names and the workload's keys, so that a YAML config
file (`sim.cli.yaml_config`) holds the same names as the command line.
"""
from __future__ import annotations

import argparse

from paged.core.config import EVICTIONS
from paged.help_formatter import ArgumentParser, HelpFormatter
from paged.workloads.options import add_workload_options, numbers, positive
from paged.workloads.traces import REPO

from .. import breakdown, calibrate_cmd
from ..compressed_swap import CODECS as SWAP_CODECS
from ..sim_config import ROUTERS, SimConfig
from .search_command import add_search_parser

OUTPUT_KEYS = ("json", "requests_csv", "timeseries_csv", "plot", "slo_ttft_s", "slo_tpot_s", "progress_bar")


def add_sim_options(p: argparse.ArgumentParser) -> None:
    d = SimConfig()
    g = p.add_argument_group("deployment")
    g.add_argument("--model", default=d.model, help="model spec (python -m sim list names them)")
    g.add_argument("--hardware", default=d.hardware,
                   help="GPU: a catalog name (python -m sim list) or a YAML/JSON spec file of datasheet figures "
                        "(README, sim/hardware_file.py); its memory sizes the KV cache, its FLOP/s and bandwidth "
                        "time the steps")
    g.add_argument("--tp", type=int, default=d.tp, help="tensor-parallel GPUs per replica")
    g.add_argument("--replicas", type=int, default=d.replicas, help="copies of the deployment behind --router")
    g.add_argument("--router", default=d.router, choices=ROUTERS, help="how requests are spread over replicas")
    g.add_argument("--frontend-latency-s", type=float, default=d.frontend_latency_s,
                   help="each request's time outside the engines (HTTP, tokenization, the router's hop, the first "
                        "streamed chunk), between its arrival and when a replica's scheduler sees it")
    g.add_argument("--kv-events-interval-s", type=float, default=d.kv_events_interval_s,
                   help="kv_aware: how often the router reads the replicas' KV events (paged router's option of "
                        "the same name, 0.25 s there); 0: it sees each event as it happens")
    g.add_argument("--cache-threshold", type=float, default=d.cache_threshold,
                   help="prefix_aware: the match rate (prefix ids its record holds / the request's) at or below "
                        "which a request goes to the replica with the smallest record instead of the best match "
                        "(SGLang router's option of the same name)")
    g = p.add_argument_group("KV cache")
    g.add_argument("--block-size", type=int, default=d.block_size, help="tokens per KV block (a power of two)")
    g.add_argument("--kv-cache-dtype", default=d.kv_cache_dtype, choices=("fp16", "fp8", "int8", "int4"),
                   help="bytes per KV element: a smaller type holds more tokens in the same memory")
    g.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization,
                   help="fraction of each GPU's memory for weights + KV cache (as vLLM's)")
    g.add_argument("--num-gpu-blocks", type=int, default=d.num_gpu_blocks,
                   help="KV blocks per replica, instead of what --hardware's memory leaves after the weights")
    g.add_argument("--swap-space-gib", type=float, default=d.swap_space_gib,
                   help="host memory per GPU for --preemption swap")
    g.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="never reuse the KV blocks of a shared prefix")
    g.add_argument("--watermark", type=float, default=d.watermark,
                   help="fraction of blocks kept free when admitting, so that running requests can grow")
    g.add_argument("--eviction", default=d.eviction, choices=EVICTIONS,
                   help="which free cached blocks are evicted first: lru (vLLM's: least recently freed) or queue "
                        "(those no waiting prompt would hit, then those the queue needs last; a static --policy)")
    g.add_argument("--queue-reserve", type=float, default=d.queue_reserve,
                   help="with --eviction queue: fraction of blocks that admission leaves to the free blocks the "
                        "waiting prompts would hit (the queue's head waits rather than evict them)")
    g.add_argument("--swap-compression", default=d.swap_compression, choices=SWAP_CODECS,
                   help="swapped blocks LZ4-compressed on the host, modelled from a measured profile")
    g.add_argument("--swap-profile", default=d.swap_profile,
                   help="python -m paged.engine.swap_profile's JSON (default: the one measured on SmolLM2-135M)")
    g.add_argument("--swap-codec-threads", type=int, default=d.swap_codec_threads, help="host cores per GPU for LZ4")
    g = p.add_argument_group("scheduler")
    g.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="most requests in one step")
    g.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens,
                   help="most tokens in one step (prefill chunks + decodes); not for --static-batching")
    g.add_argument("--max-model-len", type=int, default=d.max_model_len,
                   help="longest prompt + output (default: the model's context)")
    g.add_argument("--no-chunked-prefill", dest="enable_chunked_prefill", action="store_false",
                   help="prefill a prompt in one step, not in chunks under the token budget")
    g.add_argument("--long-prefill-token-threshold", type=int, default=d.long_prefill_token_threshold,
                   help="largest prefill chunk of one request per step (0: no limit but the budget)")
    g.add_argument("--policy", default=d.policy,
                   help="fcfs | priority | sjf | edf | lpm. priority reads the trace's optional priority and "
                        "business_value columns; edf serves by deadline: the trace's slo_s column, else "
                        "arrival + --slo-ttft-s + --slo-tpot-s * (output tokens - 1); sjf ranks by prompt + "
                        "max_tokens, which on a trace is the true output length (an oracle)")
    g.add_argument("--priority-weights", type=weights, default=d.priority_weights, metavar="A,B,C",
                   help="priority's P = A*wait_time + B*expected_tokens + C*business_value (default 1,0,1)")
    g.add_argument("--preemption", default=d.preemption, choices=("recompute", "swap"),
                   help="what happens to a request preempted for memory: its KV is dropped and recomputed, "
                        "or moved to host memory")
    g.add_argument("--static-batching", action="store_true",
                   help="the traditional baseline instead of paging: fixed batches, each reserving its whole "
                        "length, prefilled whole (no token budget) and run until the longest member is done")
    g.add_argument("--static-batch-size", type=int, default=d.static_batch_size,
                   help="requests per static batch (at most --max-num-seqs)")
    g.add_argument("--batch-timeout-s", type=float, default=d.batch_timeout_s,
                   help="a static batch starts when full, or when its oldest request has waited this long")
    g.add_argument("--static-reserve", choices=["max_model_len", "max_tokens"], default=d.static_reserve,
                   help="KV a static batch reserves per request")
    g = p.add_argument_group("cost model")
    g.add_argument("--cost-model", default=d.cost_model,
                   help="calibrated (fitted to measured GPU profiles), vidur:DIR (Vidur's measured mlp.csv profiles "
                        "under DIR), roofline, or a paged-step-profile/1 JSON file")
    g.add_argument("--mfu-efficiency", type=float, default=d.mfu_efficiency,
                   help="roofline: fraction of peak FLOP/s a step reaches")
    g.add_argument("--bandwidth-efficiency", type=float, default=d.bandwidth_efficiency,
                   help="roofline: fraction of peak memory bandwidth a step reaches")
    g.add_argument("--step-overhead-s", type=float, default=d.step_overhead_s,
                   help="fixed cost of every step (scheduling, kernel launches)")
    g = p.add_argument_group("simulator")
    g.add_argument("--no-fast-path", dest="fast_path", action="store_false", help="step one iteration at a time")
    g.add_argument("--record-itl", action="store_true",
                   help="keep every inter-token latency of every request (the itl_s column of --requests-csv)")
    g.add_argument("--timeseries-interval-s", type=float, default=None,
                   help="time-series sample spacing (default: about 1,000 samples over the arrivals, >= 10 ms). "
                        "Refused when the samples would surely outgrow half the memory; doubled, with a warning, "
                        "if a run outlasts what that check foresaw")


def weights(text: str) -> tuple[float, float, float]:
    return numbers(text, "A,B,C")


def add_output_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--json", default=None, help="write the summary (and config) as one JSON object")
    g.add_argument("--requests-csv", default=None, help="write the per-request records")
    g.add_argument("--timeseries-csv", default=None,
                   help="write KV usage, running / waiting requests and batch tokens over time, per replica")
    g.add_argument("--plot", default=None, help="write the latency CDF / KV usage figure (PNG)")
    g.add_argument("--slo-ttft-s", type=positive, default=None, help="goodput: TTFT target")
    g.add_argument("--slo-tpot-s", type=positive, default=None, help="goodput: TPOT target")
    g.add_argument("--no-progress", dest="progress_bar", action="store_false",
                   help="no progress bar (shown for 20,000 requests or more)")


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The parser, and its `run` subparser (whose defaults a --config file replaces)."""
    parser = ArgumentParser(prog="python -m sim", description="Simulate paged-KV serving.",
                                     epilog="The summary's keys are explained in docs/summary_keys.md.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="simulate a trace",
                         epilog="The summary's keys are explained in docs/summary_keys.md.")
    run.add_argument("--config", default=None, help="YAML file with the same options")
    add_workload_options(run)
    add_sim_options(run)
    add_output_options(run)
    demo = sub.add_parser("demo", help="the Azure conversation trace on Llama-2-7B / A100-80GB, with a figure")
    demo.add_argument("--out", default=str(REPO / "experiments" / "results" / "demo"),
                      help="folder for demo.png and summary.json")
    demo.add_argument("--num-requests", type=int, default=None, help="the first N requests (default: all)")
    fit = sub.add_parser("fit", help="fit a cost model to a step profile and report its error")
    fit.add_argument("profile", help="a paged-step-profile/1 JSON file (python -m paged.engine profile)")
    calibrate_cmd.add_parser(sub)
    breakdown.add_parser(sub)
    add_search_parser(sub)
    sub.add_parser("list", help="known models, hardware, routers, policies, trace formats")
    sub.add_parser("bench", help="simulated requests per wall second and peak memory (see sim.bench)",
                   add_help=False)
    for p in sub.choices.values():  # every subcommand's --help shows its defaults
        p.formatter_class = HelpFormatter
    return parser, run


def sim_config(args: argparse.Namespace) -> SimConfig:
    return SimConfig(**{k: getattr(args, k) for k in SimConfig.field_names() if hasattr(args, k)})
