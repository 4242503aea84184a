"""A compressed KV cache (8-bit, 4-bit) against fp16: how many tokens fit, what that buys in
throughput, and what dequantization costs in latency.

The article: compressed KV (4-bit or 8-bit) trades memory for time. The memory side is
arithmetic (fewer bytes per token, more blocks); the time side is not: a decode step reads every
context token's KV, so fewer bytes also mean a shorter memory-bound step, against the FP32
operations that dequantize them. The cost model holds both (see `sim.step_cost`); accuracy,
the real price of compression, is outside any simulator.

Setup: the Azure conversation trace, Llama-2-7B on one A100-80GB (calibrated cost model), kv_cache_dtype
fp16 / fp8 (e4m3, per-tensor scale) / int8 (per-token-head scale) / int4 (a scale per 32 values),
the formats `kernels.quant` implements.
Throughput at saturation (all requests queued at t=0); latency at 3 req/s, which fp16 sustains.
"""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd
from common import SATURATION, Verdict, at_load, azure_conv, outcome, parse_args, report, write_csv, write_png

from sim import KV_DTYPES, SimConfig, Workload, simulate
from sim.plots import PALETTE, figure, legend_below

NAME = "kv_compression"
LOAD_QPS = 3.0


def run(workload: Workload, kv_cache_dtype: str, loads: list[float]) -> list[dict]:
    rows = []
    for qps in loads:
        s = simulate(at_load(workload, qps), SimConfig(kv_cache_dtype=kv_cache_dtype)).summary()
        rows.append({"kv_cache_dtype": kv_cache_dtype, "offered_qps": qps, "num_gpu_blocks": s["num_gpu_blocks"],
                     "kv_capacity_tokens": s["num_gpu_blocks"] * SimConfig().block_size,
                     "throughput_req_s": s["throughput_req_s"], "output_tokens_per_s": s["output_tokens_per_s"],
                     "effective_batch_size": s["effective_batch_size_mean"], "num_preemptions": s["num_preemptions"],
                     **{f"{k}_{q}": s[k][q] for k in ("ttft_s", "tpot_s", "e2e_s") for q in ("p50", "p90", "p99")}})
    return rows


def plot(table: pd.DataFrame):
    fig, axes = figure(1, 3)
    dtypes = list(table.kv_cache_dtype.unique())
    x = np.arange(len(dtypes))
    sat = table[table.offered_qps == SATURATION].set_index("kv_cache_dtype").loc[dtypes]
    load = table[table.offered_qps == LOAD_QPS].set_index("kv_cache_dtype").loc[dtypes]
    axes[0, 0].bar(x, sat.kv_capacity_tokens / 1e3, color=PALETTE[0])
    axes[0, 0].set(ylabel="KV cache capacity (k tokens)", title="tokens that fit")
    axes[0, 1].bar(x, sat.output_tokens_per_s, color=PALETTE[0])
    axes[0, 1].set(ylabel="output tokens/s at saturation", title="throughput")
    for i, (q, hatch) in enumerate((("p50", None), ("p99", "///"))):
        axes[0, 2].bar(x + (i - 0.5) * 0.4, 1e3 * load[f"tpot_s_{q}"], width=0.4, label=f"TPOT {q}",
                       color=PALETTE[i], hatch=hatch, edgecolor="white")
    axes[0, 2].set(ylabel="ms per output token", title=f"decode latency at {LOAD_QPS:g} req/s")
    for ax in axes[0]:
        ax.set_xticks(x, dtypes)
        ax.set_xlabel("kv_cache_dtype")
    legend_below(fig, axes)
    fig.suptitle("Compressed KV cache: Azure conversation trace, Llama-2-7B on one A100-80GB")
    return fig


def verdicts(table: pd.DataFrame) -> list[Verdict]:
    sat = table[table.offered_qps == SATURATION].set_index("kv_cache_dtype")
    load = table[table.offered_qps == LOAD_QPS].set_index("kv_cache_dtype")
    base = sat.loc["fp16"]
    compressed = [d for d in sat.index if d != "fp16"]
    more = all(sat.loc[d, "kv_capacity_tokens"] > base.kv_capacity_tokens for d in compressed)
    slower = [d for d in compressed if load.loc[d, "tpot_s_p50"] > load.loc["fp16", "tpot_s_p50"]]
    text = "; ".join(f"{d}: {sat.loc[d, 'kv_capacity_tokens'] / base.kv_capacity_tokens:.1f}x tokens, "
                     f"{sat.loc[d, 'output_tokens_per_s'] / base.output_tokens_per_s:.2f}x throughput, TPOT p50 "
                     f"{1e3 * load.loc[d, 'tpot_s_p50']:.1f} ms" for d in sat.index)
    claim = "Compressed KV (4-bit or 8-bit) trades memory for time"
    smallest = sat.kv_capacity_tokens.idxmax()
    return [Verdict(claim, outcome(more and bool(slower), partly=more),
                    f"{smallest} holds {sat.loc[smallest, 'kv_capacity_tokens'] / base.kv_capacity_tokens:.1f}x the "
                    f"tokens of fp16; {'decoding is slower for ' + ', '.join(slower) if slower else 'no time is lost'}",
                    f"{text}. Memory: holds. Time: "
                    + (f"{', '.join(slower)} decode slower than fp16." if slower else
                       "no dtype decodes slower than fp16: the step is memory-bound, so reading fewer KV bytes saves "
                       "more than dequantization costs; what compression trades is accuracy, not modelled here.")
                    + " Throughput grows less than capacity: once memory stops limiting the batch, compute does.")]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(NAME, __doc__.split("\n\n")[0], argv)
    workload = azure_conv(200 if args.quick else 2000)
    dtypes = ["fp16", "int4"] if args.quick else list(KV_DTYPES)
    table = pd.DataFrame([row for d in dtypes for row in run(workload, d, [LOAD_QPS, SATURATION])])
    files = [write_csv(table, args.out, NAME), write_png(plot(table), args.out, NAME)]
    print(f"{len(workload)} requests of {workload.name}; kv_cache_dtype {dtypes}")
    report(verdicts(table), args.out, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
