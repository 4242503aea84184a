"""Latency spread of static batching against continuous batching, batch size by batch size.

The article: with static batches of 8, latency swings between 200 and 800 ms; continuous
batching with batches of 4 to 32 holds it at 350 +- 50 ms. Here "latency" is read as time to
first token (TTFT: when a chat user starts seeing an answer), with time per output token (TPOT)
and end-to-end latency beside it. A swing is a wide distribution: the p10-p90 range of a run.

Setup: the Azure conversation trace at loads a static batch of 8 sustains (its saturation is
about 0.8 req/s, see static_vs_paged.py), Llama-2-7B on one A100-80GB; static batches of
4/8/16/32 (10 ms timeout, max_model_len reserved) against continuous batching with
max_num_seqs 4/8/16/32. Latency is what a streaming client sees: TTFT at its first token,
TPOT the mean gap from its first to its last token (a request that stops before its static batch
does gets no more tokens, so it accrues no TPOT while the batch runs on), E2E until the server
returns it, which a static server does when the batch's longest member is done.
"""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd
from common import (
    Verdict,
    at_load,
    azure_conv,
    log_x,
    outcome,
    parse_args,
    report,
    span,
    write_csv,
    write_png,
)

from sim import SimConfig, Workload, simulate
from sim.plots import BAND, cdf, figure, legend_below, look, plain_log

NAME = "batch_latency"
METRICS = ("ttft_s", "tpot_s", "e2e_s")
ARTICLE_STATIC = (0.2, 0.8)  # s: static batch size 8 swings over this range
ARTICLE_CONTINUOUS = (0.35, 0.05)  # s: continuous batching 4-32 holds latency at 0.35 +- 0.05
SYSTEMS = ("static", "paged")
PAGED_STYLES = (":", "-.", (0, (3, 1, 1, 1, 1, 1)), "-")  # the largest max_num_seqs solid (static is dashed)


def spread(values: np.ndarray) -> dict[str, float]:
    v = values[~np.isnan(values)]
    p10, p50, p90, p99 = np.percentile(v, [10, 50, 90, 99])
    return {"mean": v.mean(), "std": v.std(), "p10": p10, "p50": p50, "p90": p90, "p99": p99}


def simulate_at(workload: Workload, system: str, batch_size: int):
    config = (SimConfig(static_batching=True, static_batch_size=batch_size, static_reserve="max_model_len")
              if system == "static" else SimConfig(max_num_seqs=batch_size))
    return simulate(workload, config)


def sweep(workload: Workload, loads: list[float], sizes: list[int]) -> tuple[pd.DataFrame, dict]:
    """One row per (load, system, batch size); also the per-request latencies of every run."""
    rows, runs = [], {}
    for qps in loads:
        w = at_load(workload, qps)
        for system in SYSTEMS:
            for b in sizes:
                result = simulate_at(w, system, b)
                lat = result.latency_columns()
                done = result.finished_mask()
                runs[qps, system, b] = (result.log.arrival_s[done], {m: lat[m][done] for m in METRICS})
                row = {"offered_qps": qps, "system": system, "max_batch_size": b,
                       "throughput_req_s": result.summary()["throughput_req_s"]}
                for m in METRICS:
                    row.update({f"{m}_{k}": x for k, x in spread(lat[m][done]).items()})
                rows.append(row)
    return pd.DataFrame(rows), runs


def run_look(system: str, b: int, sizes: list[int]) -> dict:
    """static: its own look; paged: blue, one line style per max_num_seqs (greyscale tells them apart)."""
    if system == "static":
        return look("static")
    return {**look("paged"), "ls": PAGED_STYLES[len(PAGED_STYLES) - len(sizes) + sizes.index(b)]}


def plot(table: pd.DataFrame, runs: dict, qps: float, sizes: list[int]):
    fig, axes = figure(2, 2)
    for ax, metric, scale in ((axes[0, 0], "ttft_s", 1), (axes[0, 1], "tpot_s", 1e3)):
        for system in SYSTEMS:
            for b in sizes if system == "paged" else [8]:
                cdf(ax, scale * runs[qps, system, b][1][metric], label=f"{system}, max batch {b}",
                    **run_look(system, b, sizes))
    axes[0, 0].set_xscale("log")
    plain_log(axes[0, 0].xaxis)  # 0.01 and 10, not two labels of 10^-2 and 10^1
    axes[0, 0].set(xlabel="seconds", title=f"time to first token at {qps:g} req/s")
    axes[0, 1].set(xlabel="ms", title=f"TPOT at {qps:g} req/s, as streamed")
    axes[0, 0].axvspan(*ARTICLE_STATIC, label="article: static 8, 200-800 ms", hatch="////", fill=False,
                       edgecolor="0.6", lw=0)
    c, pm = ARTICLE_CONTINUOUS
    axes[0, 0].axvspan(c - pm, c + pm, label="article: continuous, 350 ± 50 ms", **BAND)
    ax = axes[1, 0]
    for i, system in enumerate(SYSTEMS):
        d = table[(table.offered_qps == qps) & (table.system == system)]
        x = d.max_batch_size * (1 + 0.06 * (2 * i - 1))  # side by side on the log axis
        ax.errorbar(x, d.ttft_s_p50, yerr=[d.ttft_s_p50 - d.ttft_s_p10, d.ttft_s_p90 - d.ttft_s_p50],
                    color=look(system)["color"], marker=look(system)["marker"], ls="none")
    log_x(ax, sizes, "static: batch size; paged: max_num_seqs")
    ax.set_yscale("log")
    plain_log(ax.yaxis)
    ax.set_ylabel("TTFT (s)")
    ax.set_title(f"TTFT p50, bar p10-p90, at {qps:g} req/s")
    ax = axes[1, 1]
    for system in SYSTEMS:
        arrival, lat = runs[qps, system, 8]
        ax.scatter(arrival, lat["ttft_s"], s=4, color=look(system)["color"], marker=look(system)["marker"],
                   alpha=0.6, lw=0)
    ax.set_yscale("log")
    plain_log(ax.yaxis)
    ax.set_xlabel("arrival time (s)")
    ax.set_ylabel("TTFT (s)")
    ax.set_title("TTFT of each request, max batch 8")
    legend_below(fig, axes, ncol=3, percentiles=True)
    fig.suptitle("Latency of static batching vs continuous batching:\nAzure conversation trace, Llama-2-7B on one "
                 "A100-80GB")
    return fig


def verdicts(table: pd.DataFrame) -> list[Verdict]:
    static8 = table[(table.system == "static") & (table.max_batch_size == 8)]
    paged = table[table.system == "paged"]
    lo, hi = ARTICLE_STATIC
    swings = (static8.ttft_s_p90 / static8.ttft_s_p10 >= hi / lo).all()
    within = ((static8.ttft_s_p10 >= 0.75 * lo) & (static8.ttft_s_p90 <= 1.25 * hi)).all()
    static_text = "; ".join(f"{r.offered_qps:g} req/s: {r.ttft_s_p10:.2f}-{r.ttft_s_p90:.2f} s "
                            f"({r.ttft_s_p90 / r.ttft_s_p10:.0f}x)" for r in static8.itertuples())
    c, pm = ARTICLE_CONTINUOUS
    by_load = paged.groupby("offered_qps")
    p50_lo, p50_hi = by_load.ttft_s_p50.min(), by_load.ttft_s_p50.max()
    stable = ((p50_hi - p50_lo) / 2 <= pm / c * (p50_hi + p50_lo) / 2).all()
    tight = ((paged.ttft_s_p90 - paged.ttft_s_p10) / 2 <= pm / c * paged.ttft_s_p50).all()
    level = ((paged.ttft_s_p50 - c).abs() <= pm).all()
    paged_text = "; ".join(
        f"{q:g} req/s: p50 {span(1e3 * p50_lo[q], 1e3 * p50_hi[q])} ms over max_num_seqs, p10-p90 "
        f"{span(1e3 * d.ttft_s_p10.min(), 1e3 * d.ttft_s_p90.max())} ms, TPOT p50 {1e3 * d.tpot_s_p50.mean():.1f}"
        f" ms (p90 {1e3 * d.tpot_s_p90.max():.1f})" for q, d in by_load)
    return [
        Verdict("Static batch size 8: latency swings 200-800 ms", outcome(swings and within, partly=swings),
                f"static TTFT swings {(static8.ttft_s_p90 / static8.ttft_s_p10).max():.0f}x (p90/p10), over "
                f"{static8.ttft_s_p10.min():.2f}-{static8.ttft_s_p90.max():.2f} s: wider than 200-800 ms",
                f"TTFT p10-p90 of static batches of 8 (p90/p10): {static_text}. The swing is real and wider than the "
                "article's 4x; its range is seconds, not 200-800 ms: a request waits for the batch ahead of it to "
                "finish its longest member."),
        Verdict("Continuous batching 4-32: latency 350 +- 50 ms", outcome(stable and tight and level, partly=stable),
                f"paged TTFT p50 is {span(1e3 * paged.ttft_s_p50.min(), 1e3 * paged.ttft_s_p50.max())} ms "
                "across max_num_seqs: steady, but below 350 ms",
                f"TTFT of continuous batching: {paged_text}. The median barely moves with max_num_seqs "
                f"({'within' if stable else 'beyond'} +-{100 * pm / c:.0f}%), but it sits near "
                f"{1e3 * paged.ttft_s_p50.median():.0f} ms, not 350 ms (a 1k-token prompt prefills in ~0.1 s on an "
                "A100), and single requests spread with their prompt length; the steady figure is TPOT."),
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(NAME, __doc__.split("\n\n")[0], argv)
    if args.quick:
        workload, loads, sizes = azure_conv(150), [0.5], [4, 8, 32]
    else:
        workload, loads, sizes = azure_conv(2000), [0.25, 0.5, 0.7], [4, 8, 16, 32]
    table, runs = sweep(workload, loads, sizes)
    main_load = 0.5
    files = [write_csv(table, args.out, NAME), write_png(plot(table, runs, main_load, sizes), args.out, NAME)]
    print(f"{len(workload)} requests of {workload.name}; loads {loads} req/s; batch sizes {sizes}")
    report(verdicts(table), args.out, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
