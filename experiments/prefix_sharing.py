"""KV memory of 100 concurrent requests that share a system prompt, with and without prefix caching.

The article: 100 concurrent requests sharing a prefix need more than 40% less KV memory with
sharing. What they save is the prefix's share of each request's tokens, less one copy: the
claim holds when the shared system prompt is long enough against the rest of a request (its
own prompt and its output). The sweep finds where.

Setup: 100 requests arrive together; each has a system prompt of P tokens shared by all, a
256-token user prompt of its own and 128 output tokens. Llama-2-7B on an A100-80GB (calibrated cost model),
block size 16, chunked prefill. The cache is sized so that no run is ever short of blocks (no
preemption, nobody waits for memory): the peak then measures what the requests need, not what
the GPU has; the A100's own KV capacity is drawn for reference.
"""
from __future__ import annotations

import math
import sys

import pandas as pd
from common import Verdict, outcome, parse_args, percent, report, write_csv, write_png

from sim import SimConfig, get_hardware, get_model, plan_kv_cache, shared_prefix_workload, simulate
from sim.plots import REFERENCE, figure, legend_below, look

NAME = "prefix_sharing"
NUM_REQUESTS = 100
SUFFIX_TOKENS, OUTPUT_TOKENS = 256, 128
HEADLINE_PREFIX = 1024  # a 1k-token system prompt: the case quoted in the verdict
CONFIG = SimConfig()  # Llama-2-7B, A100-80GB, block size 16


def run(prefix_tokens: int, caching: bool) -> dict:
    """Peak KV memory of NUM_REQUESTS requests arriving together."""
    workload = shared_prefix_workload(NUM_REQUESTS, 1, prefix_tokens, SUFFIX_TOKENS, OUTPUT_TOKENS, rate=1e9,
                                      process="constant", hash_id_block_size=CONFIG.block_size)
    blocks_each = math.ceil((prefix_tokens + SUFFIX_TOKENS + OUTPUT_TOKENS) / CONFIG.block_size)
    result = simulate(workload, CONFIG, enable_prefix_caching=caching, num_gpu_blocks=NUM_REQUESTS * blocks_each + 64,
                      timeseries_interval_s=0.01)
    s = result.summary()
    block_gib = plan_kv_cache(get_model(CONFIG.model), get_hardware(CONFIG.hardware)).block_bytes / 2**30
    peak = round(s["kv_usage_max"] * s["num_gpu_blocks"])
    return {"prefix_tokens": prefix_tokens, "prefix_caching": caching,
            "prefix_share": prefix_tokens / (prefix_tokens + SUFFIX_TOKENS + OUTPUT_TOKENS),
            "peak_kv_blocks": peak, "peak_kv_gib": peak * block_gib,
            "max_concurrent": int(result.timeseries_columns["num_running"].max()),
            "num_preemptions": s["num_preemptions"], "prefix_cache_hit_rate": s["prefix_cache_hit_rate"],
            "ttft_s_p50": s["ttft_s"]["p50"], "e2e_s_p50": s["e2e_s"]["p50"],
            "simulated_time_s": s["simulated_time_s"]}


def sweep(prefixes: list[int]) -> pd.DataFrame:
    table = pd.DataFrame([run(p, c) for p in prefixes for c in (False, True)])
    without = table[~table.prefix_caching].set_index("prefix_tokens").peak_kv_blocks
    table["kv_saved"] = 1 - table.peak_kv_blocks / table.prefix_tokens.map(without)
    # What perfect sharing saves: all but one copy of the prefix's whole blocks.
    shared_blocks = table.prefix_tokens // CONFIG.block_size * (NUM_REQUESTS - 1)
    table["kv_saved_ideal"] = shared_blocks / table.prefix_tokens.map(without)
    return table


def plot(table: pd.DataFrame):
    fig, axes = figure(1, 2)
    ax = axes[0, 0]
    for caching, label in ((False, "without prefix caching"), (True, "with prefix caching")):
        d = table[table.prefix_caching == caching]
        ax.plot(d.prefix_tokens, d.peak_kv_gib, label=label, **look(label))
    plan = plan_kv_cache(get_model(CONFIG.model), get_hardware(CONFIG.hardware))
    ax.axhline(plan.kv_bytes / 2**30, label="A100-80GB KV capacity", **{**REFERENCE, "ls": ":"})
    ax.set_xlabel("shared system prompt (tokens)")
    ax.set_ylabel("peak KV memory (GiB)")
    ax.set_title(f"{NUM_REQUESTS} concurrent requests, one shared prompt")
    ax = axes[0, 1]
    d = table[table.prefix_caching]
    # the same system, so the same look and name: one legend entry, not two alike ("saved, measured")
    ax.plot(100 * d.prefix_share, 100 * d.kv_saved, label="with prefix caching", **look("with prefix caching"))
    ax.plot(100 * d.prefix_share, 100 * d.kv_saved_ideal, label="saved, all but one copy of the prefix",
            **{**look(2), "marker": "none"})
    ax.axhline(40, label="article: > 40%", **REFERENCE)
    ax.set_xlabel("shared prefix / tokens of a request (%)")
    ax.set_ylabel("KV memory saved (%)")
    ax.set_title("memory saved by sharing")
    legend_below(fig, axes, ncol=3)
    fig.suptitle(f"Prefix sharing: {SUFFIX_TOKENS}-token own prompt and {OUTPUT_TOKENS} output tokens per "
                 "request,\nLlama-2-7B on one A100-80GB")
    return fig


def verdicts(table: pd.DataFrame) -> list[Verdict]:
    d = table[table.prefix_caching].set_index("prefix_tokens")
    headline = HEADLINE_PREFIX if HEADLINE_PREFIX in d.index else d.index.max()
    saved = d.loc[headline, "kv_saved"]
    over = d[d.kv_saved > 0.4]
    threshold = (f"it holds from a {over.index.min()}-token prompt up ({percent(over.prefix_share.min())} of a "
                 f"request's tokens; {over.index.max()} tokens: {percent(over.kv_saved.max())} saved), "
                 if len(over) else "it holds for no prompt length tried, ")
    concurrent = table.max_concurrent.min()
    together = "all running at once" if concurrent == NUM_REQUESTS else f"at least {concurrent} running at once"
    return [Verdict(f"{NUM_REQUESTS} concurrent requests sharing a prefix: KV memory down more than 40%",
                    outcome(saved > 0.4 and len(over) == len(d[d.index > 0]), partly=len(over) > 0),
                    f"a {headline}-token shared prompt saves {percent(saved)}; over 40% "
                    + (f"from {over.index.min()} tokens up" if len(over) else "at no length tried"),
                    f"a {headline}-token shared prompt saves {percent(saved)} of peak KV memory "
                    f"({d.loc[headline, 'peak_kv_gib']:.1f} vs "
                    f"{table[~table.prefix_caching].set_index('prefix_tokens').loc[headline, 'peak_kv_gib']:.1f} GiB, "
                    f"{together}); {threshold}with {SUFFIX_TOKENS} own prompt and "
                    f"{OUTPUT_TOKENS} output tokens. Sharing saves up to the prefix's share of the tokens, so a short "
                    "system prompt against long conversations saves less than 40%.")]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(NAME, __doc__.split("\n\n")[0], argv)
    prefixes = [0, 256, 1024] if args.quick else [0, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048]
    table = sweep(prefixes)
    files = [write_csv(table, args.out, NAME), write_png(plot(table), args.out, NAME)]
    print(f"{NUM_REQUESTS} requests sharing one system prompt of {prefixes} tokens")
    report(verdicts(table), args.out, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
