"""Prefix-cache hit rate of the Mooncake trace against the size of the KV cache.

Mooncake's requests carry one hash id per 512-token block of their prompt, equal ids meaning an
identical prefix: the reuse of a real long-context service. How much of it a cache catches
depends on how much it can keep: this sweeps the number of KV blocks, from the least that
holds the longest prompt up to more than the trace's distinct content, and compares the hit
rate with what an unlimited cache would catch (ids seen before, in arrival order).

Setup: Llama-3.1-8B (128k context) on one H200, block size 16, LRU eviction of unreferenced
cached blocks, FCFS; arrivals stretched 4x (about 1 req/s) so that the replica keeps up
and the hit rate reflects the cache, not a queue. Sizes beyond one GPU's memory stand for a
larger tier (host memory, a pool of GPUs), as in Mooncake's own design.
"""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd
from common import MOONCAKE, Verdict, log_x, outcome, parse_args, percent, report, write_csv, write_png

from sim import SimConfig, Workload, get_hardware, get_model, load_workload, plan_kv_cache, simulate
from sim.plots import P50, REFERENCE, figure, legend_below, look, plain_log

NAME = "prefix_hit_rate"
CONFIG = SimConfig(model="llama-3.1-8b", hardware="h200")
TIME_SCALE = 4.0


def unlimited_hit_rate(workload: Workload) -> float:
    """The share of prompt tokens an unlimited cache would hit: each request's leading run of ids
    seen before (sharing is prefix-shaped), in arrival order."""
    seen: set[int] = set()
    hit = 0
    for i in range(len(workload)):
        ids = workload.prefix_ids(i) or []
        run = next((k for k, x in enumerate(ids) if x not in seen), len(ids))
        hit += min(run * workload.hash_id_block_size, int(workload.num_prompt_tokens[i]))
        seen.update(ids)
    return hit / workload.num_prompt_tokens.sum()


def run(workload: Workload, num_gpu_blocks: int, block_gib: float) -> dict:
    result = simulate(workload, CONFIG, num_gpu_blocks=num_gpu_blocks)
    s = result.summary()
    req = result.requests
    return {"num_gpu_blocks": num_gpu_blocks, "cache_tokens": num_gpu_blocks * CONFIG.block_size,
            "cache_gib": num_gpu_blocks * block_gib, "prefix_cache_hit_rate": s["prefix_cache_hit_rate"],
            # per request, counted once even if it was preempted and admitted again
            "prompt_tokens_hit": req.prefix_hit_tokens.sum() / req.num_prompt_tokens.sum(),
            "ttft_s_p50": s["ttft_s"]["p50"], "ttft_s_p90": s["ttft_s"]["p90"],
            "throughput_req_s": s["throughput_req_s"], "num_preemptions": s["num_preemptions"],
            "num_rejected": s["num_rejected"]}


def plot(table: pd.DataFrame, bound: float, gpu_gib: float):
    fig, axes = figure(1, 2)
    ax = axes[0, 0]
    ax.plot(table.cache_gib, 100 * table.prefix_cache_hit_rate, label="hit rate, simulated (LRU)", **look(0))
    ax.axhline(100 * bound, label=f"hit rate, unlimited cache: {percent(bound)}", **REFERENCE)
    ax.set_ylabel("hit rate (% of prompt tokens)")
    ax.set_ylim(bottom=0)
    ax.set_title("hit rate vs cache size")
    ax2 = axes[0, 1]
    ax2.plot(table.cache_gib, table.ttft_s_p50, label="TTFT p50", **{**look(0), "marker": P50["marker"]})
    ax2.plot(table.cache_gib, table.ttft_s_p90, label="TTFT p90", **{**look(0), "ls": "--", "marker": "s",
                                                                         "mfc": "white"})
    ax2.set_yscale("log")
    plain_log(ax2.yaxis)
    ax2.set_ylabel("TTFT (s)")
    ax2.set_title("time to first token vs cache size")
    ticks = [4**k for k in range(1, 8) if table.cache_gib.min() / 1.5 <= 4**k <= table.cache_gib.max()]
    for a in (ax, ax2):
        log_x(a, ticks, "KV cache size (GiB, fp16)")
        a.axvline(gpu_gib, label=f"one H200's KV memory: {gpu_gib:.0f} GiB", **{**REFERENCE, "ls": ":"})
    legend_below(fig, axes, ncol=2)
    fig.suptitle(f"Mooncake trace (arrivals x{TIME_SCALE:g}): {CONFIG.model} on {CONFIG.hardware}, "
                 f"block size {CONFIG.block_size}")
    return fig


def verdicts(table: pd.DataFrame, bound: float, gpu_blocks: int) -> list[Verdict]:
    small, large = table.iloc[0], table.iloc[-1]
    at_gpu = table[table.num_gpu_blocks == gpu_blocks].iloc[0]
    grows = bool(np.all(np.diff(table.prefix_cache_hit_rate) >= -0.005))
    return [Verdict("The prefix hit rate grows with the cache, up to the trace's reuse",
                    outcome(grows and large.prefix_cache_hit_rate >= 0.9 * bound),
                    f"hit rate {percent(small.prefix_cache_hit_rate)} -> {percent(large.prefix_cache_hit_rate)} "
                    f"from {small.cache_gib:.0f} to {large.cache_gib:.0f} GiB (unlimited: {percent(bound)})",
                    f"{percent(small.prefix_cache_hit_rate)} at {small.cache_gib:.0f} GiB, "
                    f"{percent(at_gpu.prefix_cache_hit_rate)} at {at_gpu.cache_gib:.0f} GiB (one H200's KV "
                    f"memory), {percent(large.prefix_cache_hit_rate)} at {large.cache_gib:.0f} GiB, against "
                    f"{percent(bound)} for an unlimited cache; TTFT p50 {small.ttft_s_p50:.2f} -> "
                    f"{large.ttft_s_p50:.2f} s. One GPU's cache catches a fraction of the reuse; the rest needs a "
                    "larger tier.")]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(NAME, __doc__.split("\n\n")[0], argv)
    max_len = get_model(CONFIG.model).max_model_len
    workload = load_workload(MOONCAKE, num_requests=300 if args.quick else None, time_scale=TIME_SCALE,
                             max_model_len=max_len)
    plan = plan_kv_cache(get_model(CONFIG.model), get_hardware(CONFIG.hardware), block_size=CONFIG.block_size)
    block_gib = plan.block_bytes / 2**30
    least = -(-max_len // CONFIG.block_size)  # the longest prompt must fit
    sizes = sorted({plan.num_gpu_blocks, *(least * 2**k for k in ((0, 2, 4) if args.quick else range(9)))})
    table = pd.DataFrame([run(workload, n, block_gib) for n in sizes])
    bound = unlimited_hit_rate(workload)
    gpu_gib = plan.num_gpu_blocks * block_gib
    files = [write_csv(table, args.out, NAME), write_png(plot(table, bound, gpu_gib), args.out, NAME)]
    print(f"{len(workload)} requests of {workload.name}; cache sizes {sizes} blocks; one {CONFIG.hardware} holds "
          f"{plan.num_gpu_blocks} blocks")
    report(verdicts(table, bound, plan.num_gpu_blocks), args.out, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
