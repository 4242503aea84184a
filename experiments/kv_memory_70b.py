"""The article's 70B claim: a compressed KV cache (4-bit or 8-bit) plus LZ4 on swapped blocks cut
Llama-2-70B's memory from 280 GB to 175 GB at a 3-5% cost. What saves what, and at which cost?

Three measurements, each from what this project implements and measured, none guessed:

1. Memory (the formats' bytes, `kernels.quant` = `sim.models`): the article's 280 GB is Llama-2-70B's
   fp16 weights (138 GB) plus 142 GB of fp16 KV (433k tokens at 0.33 MB a token). The same tokens
   in int8, fp8 and int4 KV, scales included, give each dtype's total. LZ4 compresses swapped
   blocks in *host* memory: it moves no GPU byte; what it saves is `1 - ratio` of the swap space,
   with the ratio measured on SmolLM2's real KV (`python -m paged.engine.swap_profile`).
2. Time (the simulator, Llama-2-70B on 4 x A100-80GB, roofline, the Azure conversation trace):
   each dtype's throughput at saturation and TPOT at a moderate load, against fp16.
3. Accuracy (the engine, `python -m paged.engine.kv_accuracy`, SmolLM2-135M: a 70B model is not
   runnable here, and a small model is the more sensitive): greedy agreement with the fp16 cache.

And whether LZ4 on KV bytes pays: the same deployment with its memory pressed (a 0.5 GPU memory
utilization leaves 34 GB of KV, so requests are preempted and swapped), swapping plain, with LZ4
on one host core per GPU, on eight, and recomputing instead: throughput and latency.
"""
from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
from common import REPO, SATURATION, Verdict, at_load, azure_conv, outcome, parse_args, report, write_csv, write_png

from sim import SimConfig, get_model, simulate
from sim.compressed_swap import DEFAULT_PROFILE, SwapProfile
from sim.hardware import get_hardware
from sim.plots import PALETTE, figure
from sim.runner import build_cost_model

NAME = "kv_memory_70b"
MODEL, HARDWARE, TP = "llama-2-70b", "a100-80gb", 4
ARTICLE_BEFORE_GB, ARTICLE_AFTER_GB = 280.0, 175.0
DTYPES = ("fp16", "int8", "fp8", "int4")
LOAD_QPS = 2.0
PRESSED_UTILIZATION = 0.5
ACCURACY = REPO / "experiments" / "measured" / "kv_accuracy_smollm2.json"
SWAP_CASES = {  # name -> SimConfig fields
    "recompute": {"preemption": "recompute"},
    "swap": {"preemption": "swap"},
    "swap + lz4, 1 core": {"preemption": "swap", "swap_compression": "lz4", "swap_codec_threads": 1},
    "swap + lz4, 8 cores": {"preemption": "swap", "swap_compression": "lz4", "swap_codec_threads": 8},
}


def memory_table(swap_space_gib: float) -> pd.DataFrame:
    """GPU memory for the article's fp16 KV tokens in each dtype, and the host swap pool with LZ4."""
    model = get_model(MODEL)
    weights = model.weight_bytes / 1e9
    tokens = (ARTICLE_BEFORE_GB - weights) * 1e9 / model.kv_bytes_per_token("fp16")
    rows = []
    for dtype in DTYPES:
        kv = tokens * model.kv_bytes_per_token(dtype) / 1e9
        lz4 = SwapProfile.load(DEFAULT_PROFILE, dtype, "lz4")
        rows.append({"kind": "memory", "kv_cache_dtype": dtype, "weights_gb": weights, "kv_tokens": tokens,
                     "kv_gb": kv, "gpu_total_gb": weights + kv, "lz4_ratio": lz4.ratio,
                     "lz4_shuffle_ratio": SwapProfile.load(DEFAULT_PROFILE, dtype, "lz4-shuffle").ratio,
                     "lz4_compress_mb_s": lz4.compress_mb_s, "lz4_decompress_mb_s": lz4.decompress_mb_s,
                     "host_swap_gb": swap_space_gib * TP * 2**30 / 1e9,
                     "host_swap_gb_lz4": swap_space_gib * TP * 2**30 / 1e9 * lz4.ratio})
    return pd.DataFrame(rows)


def serving_rows(workload, dtypes) -> list[dict]:
    rows = []
    for dtype in dtypes:
        for qps in (LOAD_QPS, SATURATION):
            config = SimConfig(model=MODEL, hardware=HARDWARE, tp=TP, kv_cache_dtype=dtype)
            s = simulate(at_load(workload, qps), config).summary()
            rows.append({"kind": "serving", "kv_cache_dtype": dtype, "offered_qps": qps,
                         "num_gpu_blocks": s["num_gpu_blocks"], "output_tokens_per_s": s["output_tokens_per_s"],
                         "tpot_s_p50": s["tpot_s"]["p50"], "e2e_s_p50": s["e2e_s"]["p50"]})
    return rows


def swap_rows(workload, dtypes) -> list[dict]:
    rows = []
    for dtype in dtypes:
        for case, fields in SWAP_CASES.items():
            config = SimConfig(model=MODEL, hardware=HARDWARE, tp=TP, kv_cache_dtype=dtype,
                               gpu_memory_utilization=PRESSED_UTILIZATION, **fields)
            s = simulate(at_load(workload, SATURATION), config).summary()
            rows.append({"kind": "swap", "kv_cache_dtype": dtype, "swap_case": case,
                         "num_gpu_blocks": s["num_gpu_blocks"], "num_preemptions": s["num_preemptions"],
                         "output_tokens_per_s": s["output_tokens_per_s"], "e2e_s_p50": s["e2e_s"]["p50"],
                         "swap_ms_per_block": 1e3 * swap_seconds(config)})
    return rows


def swap_seconds(config: SimConfig) -> float:
    """One block's move (mean of out and in) on this configuration, as the cost model charges it."""
    if config.preemption != "swap":
        return 0.0
    cost = build_cost_model(config)
    return cost.step_seconds(num_swapped_blocks=1) - cost.step_seconds()


def plot(table: pd.DataFrame, accuracy: dict):
    fig, column = figure(3, 1, height=2.4)
    axes = column.reshape(1, 3)  # one panel a row, each legend under its panel or in headroom above its data
    mem = table[table.kind == "memory"].set_index("kv_cache_dtype")
    x = np.arange(len(mem))
    axes[0, 0].bar(x, mem.weights_gb, label="weights (fp16)", **bar(0))
    axes[0, 0].bar(x, mem.kv_gb, bottom=mem.weights_gb, label="KV (same tokens)", **bar(1))
    for y, text, ls in ((ARTICLE_BEFORE_GB, "article: before, 280 GB", "--"),
                        (ARTICLE_AFTER_GB, "article: after, 175 GB", ":")):
        axes[0, 0].axhline(y, color="0.3", linestyle=ls, linewidth=1, label=text)
    axes[0, 0].set(ylabel="GPU memory (GB)", title="Llama-2-70B: weights + 433k tokens of KV")
    axes[0, 0].set_xticks(x, mem.index)
    axes[0, 0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)

    serving = table[(table.kind == "serving") & np.isinf(table.offered_qps)].set_index("kv_cache_dtype")
    load = table[(table.kind == "serving") & (table.offered_qps == LOAD_QPS)].set_index("kv_cache_dtype")
    dtypes = list(serving.index)
    x = np.arange(len(dtypes))
    width = 0.27
    base_tput, base_tpot = serving.loc["fp16", "output_tokens_per_s"], load.loc["fp16", "tpot_s_p50"]
    axes[0, 1].bar(x - width, serving.output_tokens_per_s / base_tput, width, label="throughput (saturation)",
                   **bar(0))
    axes[0, 1].bar(x, load.tpot_s_p50 / base_tpot, width, label=f"TPOT p50 at {LOAD_QPS:g} req/s", **bar(1))
    axes[0, 1].bar(x + width, [accuracy[d]["prefix_match"] for d in dtypes], width,
                   label="greedy match (SmolLM2)", **bar(2))
    axes[0, 1].axhline(1.0, color="gray", linewidth=1, label="fp16")
    axes[0, 1].set(ylabel="relative to fp16", title="what it costs (sim: 4 x A100; engine: SmolLM2)")
    axes[0, 1].set_xticks(x, dtypes)
    axes[0, 1].legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)

    swap = table[table.kind == "swap"]
    cases = list(SWAP_CASES)
    x = np.arange(len(cases))
    for i, (dtype, rows) in enumerate(swap.groupby("kv_cache_dtype", sort=False)):
        rows = rows.set_index("swap_case").loc[cases]
        axes[0, 2].bar(x + (i - 0.5) * 0.4, rows.output_tokens_per_s, 0.4, label=dtype, **bar(i))
    axes[0, 2].set(ylabel="output tokens/s",
                   title=f"memory pressed ({PRESSED_UTILIZATION:g} utilization): swap with LZ4?")
    axes[0, 2].set_xticks(x, [c.replace(", ", "\n").replace(" + ", "\n+ ").replace("recompute", "re-\ncompute")
                              for c in cases])
    axes[0, 2].set_ylim(0, 1.35 * swap.output_tokens_per_s.max())
    axes[0, 2].legend(loc="upper center", ncol=2)
    fig.suptitle("KV compression for Llama-2-70B: memory, cost, LZ4 on swapped blocks")
    return fig


def bar(i: int) -> dict:
    """The i-th bar series' colour and hatch: apart in greyscale too."""
    return {"color": PALETTE[i], "hatch": ("", "///", "...")[i], "edgecolor": "white"}


def verdicts(table: pd.DataFrame, accuracy: dict) -> list[Verdict]:
    mem = table[table.kind == "memory"].set_index("kv_cache_dtype")
    sat = table[(table.kind == "serving") & np.isinf(table.offered_qps)].set_index("kv_cache_dtype")
    load = table[(table.kind == "serving") & (table.offered_qps == LOAD_QPS)].set_index("kv_cache_dtype")
    swap = table[table.kind == "swap"]
    compressed = [d for d in sat.index if d != "fp16"]
    four_bit = mem.loc["int4"]
    pure_4bit = four_bit.weights_gb + (ARTICLE_BEFORE_GB - four_bit.weights_gb) / 4
    memory_text = "; ".join(f"{d} {mem.loc[d, 'gpu_total_gb']:.0f} GB" for d in mem.index)
    lz4_gpu_saving = 0.0  # LZ4 compresses host blocks only
    v1 = Verdict(
        "Compressed KV (4-bit or 8-bit) plus LZ4-compressed swap cut Llama-2-70B's memory from 280 GB to 175 GB",
        # The figure is reproduced by 4-bit KV alone; the claim's credit to LZ4 is what does not hold.
        outcome(False, partly=abs(four_bit.gpu_total_gb - ARTICLE_AFTER_GB) <= 10),
        f"int4 KV alone gives {four_bit.gpu_total_gb:.0f} GB (article: {ARTICLE_AFTER_GB:.0f}); LZ4 saves "
        f"{lz4_gpu_saving:.0f} GB of GPU memory",
        f"GPU memory for the article's 433k fp16 tokens, weights {four_bit.weights_gb:.0f} GB + KV: {memory_text}. "
        f"int4 alone does it ({four_bit.gpu_total_gb:.0f} GB with its float32 group scales, {pure_4bit:.0f} GB "
        f"for bare 4-bit values); 8-bit gets to {mem.loc['int8', 'gpu_total_gb']:.0f} GB. LZ4 saves "
        f"{lz4_gpu_saving:.0f} GB of it: it compresses swapped blocks in host memory, where it measured a ratio of "
        f"{mem.loc['fp16', 'lz4_ratio']:.3f} on fp16 KV and {four_bit.lz4_ratio:.3f} on int4 (SmolLM2's real "
        f"KV), i.e. {mem.loc['fp16', 'host_swap_gb'] - mem.loc['fp16', 'host_swap_gb_lz4']:.1f} of a "
        f"{mem.loc['fp16', 'host_swap_gb']:.0f} GB fp16 swap pool.")
    tput = {d: sat.loc[d, "output_tokens_per_s"] / sat.loc["fp16", "output_tokens_per_s"] - 1 for d in compressed}
    tpot = {d: load.loc[d, "tpot_s_p50"] / load.loc["fp16", "tpot_s_p50"] - 1 for d in compressed}
    time_text = "; ".join(f"{d}: throughput {tput[d]:+.1%}, TPOT p50 {tpot[d]:+.1%}" for d in compressed)
    acc_text = "; ".join(f"{d} {accuracy[d]['prefix_match']:.0%} (token match {accuracy[d]['token_match']:.0%}, "
                         f"{accuracy[d]['identical']:.0%} of prompts identical)" for d in compressed)
    time_ok = all(tpot[d] <= 0.05 and tput[d] >= -0.05 for d in compressed)
    cost = max([-t for t in tput.values()] + list(tpot.values()))  # the worst slowdown; under 0: none
    cost_text = f"time cost at most {cost:.1%}" if cost >= 0.0005 else "no time cost (every format as fast or faster)"
    costly = [d for d in compressed if accuracy[d]["prefix_match"] < 0.95]
    accuracy_ok = not costly
    v2 = Verdict(
        "... at a 3-5% cost",
        outcome(time_ok and accuracy_ok, partly=time_ok),
        f"{cost_text}; accuracy cost "
        + (f"over 5% for {', '.join(costly)}" if costly else "within 5%"),
        f"Time (simulated, 4 x A100-80GB, Azure conv): {time_text}: {cost_text}, since a memory-bound decode "
        "reads fewer KV bytes and dequantization costs about what they save. Accuracy (greedy, the fp16 cache "
        f"as reference, SmolLM2-135M, {accuracy['num_prompts']} prompts x {accuracy['max_tokens']} tokens): the "
        f"share of fp16's tokens produced before the first difference is {acc_text}. The price is accuracy: "
        + (f"more than 5% of the fp16 output lost for {', '.join(costly)} on this model" if costly else
           "within 5% for every format")
        + " (a 70B model may degrade less; not measured here).")
    by = swap.set_index(["kv_cache_dtype", "swap_case"])
    lz4_text = "; ".join(
        f"{d}: swap {by.loc[(d, 'swap'), 'output_tokens_per_s']:.0f} tok/s "
        f"({by.loc[(d, 'swap'), 'swap_ms_per_block']:.2f} ms a block), + lz4 on 1 core "
        f"{by.loc[(d, 'swap + lz4, 1 core'), 'output_tokens_per_s']:.0f} "
        f"({by.loc[(d, 'swap + lz4, 1 core'), 'swap_ms_per_block']:.2f} ms), on 8 cores "
        f"{by.loc[(d, 'swap + lz4, 8 cores'), 'output_tokens_per_s']:.0f}, recompute "
        f"{by.loc[(d, 'recompute'), 'output_tokens_per_s']:.0f} ({by.loc[(d, 'swap'), 'num_preemptions']:.0f} "
        "preemptions)"
        for d in swap.kv_cache_dtype.unique())
    pays = any(by.loc[(d, "swap + lz4, 8 cores"), "output_tokens_per_s"] > by.loc[(d, "swap"), "output_tokens_per_s"]
               for d in swap.kv_cache_dtype.unique())
    pcie = get_hardware(HARDWARE).pcie_bandwidth / 1e9
    v3 = Verdict(
        "LZ4 on KV bytes pays (as a swap codec)",
        outcome(pays),
        f"LZ4 ratio {mem.loc['fp16', 'lz4_ratio']:.3f} on fp16 KV: it " + ("pays" if pays else "does not pay")
        + " as a swap codec",
        f"Measured LZ4 ratio {mem.loc['fp16', 'lz4_ratio']:.3f} on fp16 KV (full blocks) at "
        f"{mem.loc['fp16', 'lz4_compress_mb_s']:.0f}/{mem.loc['fp16', 'lz4_decompress_mb_s']:.0f} MB/s "
        f"(compress/decompress, one core); byte-shuffled first, at best {mem.lz4_shuffle_ratio.min():.3f} (on "
        f"{mem.lz4_shuffle_ratio.idxmin()}): K/V bytes are near-random to LZ4, whose only find is a sequence's "
        f"unwritten last slots, and one core compresses {pcie * 1e3 / mem.loc['fp16', 'lz4_compress_mb_s']:.0f}x "
        f"slower than PCIe's {pcie:.0f} GB/s copies. Memory pressed ({PRESSED_UTILIZATION:g} utilization, "
        f"saturation): {lz4_text}. LZ4 "
        + ("pays here." if pays else f"does not pay: it buys {1 / mem.loc['fp16', 'lz4_ratio'] - 1:.1%} more host "
                                     "blocks and makes every swap codec-bound; quantizing the cache removes the "
                                     "pressure that makes swapping happen at all."))
    return [v1, v2, v3]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(NAME, __doc__.split("\n\n")[0], argv)
    with open(ACCURACY) as f:
        measured = json.load(f)
    accuracy = {**measured["results"], "num_prompts": measured["num_prompts"], "max_tokens": measured["max_tokens"]}
    workload = azure_conv(200 if args.quick else 2000, model=MODEL)
    dtypes = ("fp16", "int4") if args.quick else DTYPES
    table = pd.concat([memory_table(SimConfig().swap_space_gib),
                       pd.DataFrame(serving_rows(workload, dtypes) + swap_rows(workload, ("fp16", "int4")))],
                      ignore_index=True)
    files = [write_csv(table, args.out, NAME), write_png(plot(table, accuracy), args.out, NAME)]
    print(f"{len(workload)} requests of {workload.name}; {MODEL} on {TP} x {HARDWARE}; kv_cache_dtype {list(dtypes)}")
    report(verdicts(table, accuracy), args.out, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
