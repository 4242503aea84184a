"""The article's health thresholds for a serving deployment, checked against each other.

The article: a healthy deployment keeps KV usage at 60-90%, P99 latency under 1 s (chat),
more than 500 output tokens/s per GPU and a decode failure rate under 0.1%, and watches
fragmentation, effective batch size and queue depth. Each threshold alone is easy to meet;
the question is whether one load meets them all. "P99 latency" is read as TTFT p99 (when a
chat user starts seeing an answer: E2E of a chat answer is many seconds by construction).
A failure is a request that does not finish (the simulator has no crashes: rejections only).

Setup: the Azure conversation trace, arrivals rescaled from 20% to 110% of each deployment's
saturation throughput (every request at t=0), on three deployments: Llama-2-7B and Llama-2-13B
on one A100-80GB, Llama-3-8B on one H100, paged continuous batching with vLLM's defaults.
KV usage is the pool's held share while requests are served.
"""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd
from common import (
    Verdict,
    at_load,
    azure_conv,
    outcome,
    parse_args,
    percent,
    report,
    saturation_throughput,
    write_csv,
    write_png,
)

from paged.health import FAILURE_RATE, KV_BAND, TOKENS_PER_S_PER_GPU
from paged.health import P99_LATENCY_S as P99_TTFT_S
from sim import SimConfig, Workload, simulate
from sim.plots import BAND, REFERENCE, figure, legend_below, look, plain_log

NAME = "health"
DEPLOYMENTS = (("llama-2-7b", "a100-80gb"), ("llama-2-13b", "a100-80gb"), ("llama-3-8b", "h100"))


def run(workload: Workload, config: SimConfig) -> dict:
    result = simulate(workload, config)
    s, ts = result.summary(), result.timeseries_columns
    serving = ts["num_running"] > 0
    gpus = config.tp * config.replicas
    row = {
        "kv_usage": ts["kv_usage"][serving].mean() if serving.any() else 0.0,
        "ttft_s_p99": s["ttft_s"]["p99"], "tpot_s_p99": s["tpot_s"]["p99"], "e2e_s_p99": s["e2e_s"]["p99"],
        "output_tokens_per_s_per_gpu": s["output_tokens_per_s"] / gpus,
        "failure_rate": 1 - s["num_finished"] / s["num_requests"],
        "preemptions_per_request": s["num_preemptions"] / s["num_requests"],
        "fragmentation": s["fragmentation_mean"], "effective_batch_size": s["effective_batch_size_mean"],
        "queue_depth": ts["num_waiting"].mean(),
    }
    row["kv_ok"] = KV_BAND[0] <= row["kv_usage"] <= KV_BAND[1]
    row["latency_ok"] = row["ttft_s_p99"] < P99_TTFT_S
    row["tokens_ok"] = row["output_tokens_per_s_per_gpu"] > TOKENS_PER_S_PER_GPU
    row["failures_ok"] = row["failure_rate"] < FAILURE_RATE
    row["healthy"] = row["kv_ok"] and row["latency_ok"] and row["tokens_ok"] and row["failures_ok"]
    return row


def sweep(workload: Workload, fractions: list[float]) -> pd.DataFrame:
    rows = []
    for model, hardware in DEPLOYMENTS:
        config = SimConfig(model=model, hardware=hardware)
        sat = saturation_throughput(workload, config)
        for frac in fractions:
            rows.append({"deployment": f"{model} / {hardware}", "load_of_saturation": frac, "offered_qps": frac * sat,
                         **run(at_load(workload, frac * sat), config)})
    return pd.DataFrame(rows)


def plot(table: pd.DataFrame):
    fig, axes = figure(2, 2)
    for i, (name, d) in enumerate(table.groupby("deployment", sort=False)):
        x = 100 * d.load_of_saturation
        style = look(2 + i)  # deployments, not systems: looks of their own
        axes[0, 0].plot(x, d.ttft_s_p99, label=name, **style)
        axes[0, 1].plot(x, 100 * d.kv_usage, label=name, **style)
        axes[1, 0].plot(x, d.output_tokens_per_s_per_gpu, label=name, **style)
        axes[1, 1].plot(100 * d.kv_usage, d.ttft_s_p99, label=name, **style)
    for ax in (axes[0, 0], axes[1, 1]):
        ax.axhline(P99_TTFT_S, label="article: P99 < 1 s", **REFERENCE)
    axes[0, 1].axhspan(*(100 * np.array(KV_BAND)), label="article: KV usage 60-90%", **BAND)
    axes[1, 1].axvspan(*(100 * np.array(KV_BAND)), **BAND)
    # solid: dash-dotted, it was llama-2-7b's line (look(2)) in grey, crossing it at 500 tokens/s
    axes[1, 0].axhline(TOKENS_PER_S_PER_GPU, label="article: > 500 tokens/s per GPU", **{**REFERENCE, "ls": "-"})
    for ax in (axes[0, 0], axes[1, 1]):
        ax.set_yscale("log")
        plain_log(ax.yaxis)
        ax.set_ylabel("TTFT p99 (s)")
    for ax in (axes[0, 0], axes[0, 1], axes[1, 0]):
        ax.set_xlabel("offered load (% of saturation)")
    axes[0, 1].set_ylabel("KV usage while serving (%)")
    axes[1, 0].set_ylabel("output tokens/s per GPU")
    axes[1, 1].set_xlabel("KV usage while serving (%)")
    axes[0, 0].set_title("tail latency by load")
    axes[0, 1].set_title("KV usage by load")
    axes[1, 0].set_title("throughput by load")
    axes[1, 1].set_title("tail latency against KV usage")
    legend_below(fig, axes, ncol=2)
    fig.suptitle("Health thresholds on the Azure conversation trace:\ncan one load meet them all?")
    return fig


def verdicts(table: pd.DataFrame) -> list[Verdict]:
    texts, healthy = [], []
    for name, d in table.groupby("deployment", sort=False):
        fast = d[d.latency_ok]
        full = d[d.kv_usage >= KV_BAND[0]]
        fast_text = (f"TTFT p99 < 1 s up to {fast.load_of_saturation.max():.0%} load, where KV usage is "
                     f"{percent(fast.kv_usage.iloc[-1])}") if len(fast) else "TTFT p99 >= 1 s at every load"
        full_text = (f"KV usage >= 60% from {full.load_of_saturation.min():.0%} load, where TTFT p99 is "
                     f"{full.ttft_s_p99.iloc[0]:.1f} s and queue depth {full.queue_depth.iloc[0]:.1f}"
                     ) if len(full) else "KV usage < 60% at every load"
        healthy.append(bool(d.healthy.any()))
        fast_tokens = d[d.tokens_ok]
        tokens_text = (f"> 500 tokens/s per GPU from {fast_tokens.load_of_saturation.min():.0%} load"
                       if len(fast_tokens) else "<= 500 tokens/s per GPU at every load")
        texts.append(f"{name}: {fast_text}; {full_text}; {tokens_text}; failures {percent(d.failure_rate.max())}")
    in_band_and_slow = table[table.kv_ok & ~table.latency_ok]
    closing = (". KV usage climbs into the band only near saturation, where the queue builds and the tail latency "
               "breaks: 60-90% KV usage is the sign of a deployment at its limit, not a target to run at."
               if len(in_band_and_slow) and not any(healthy) else ".")
    return [Verdict(
        "Healthy: KV usage 60-90%, P99 latency < 1 s, > 500 tokens/s per GPU, failure rate < 0.1%",
        outcome(all(healthy), partly=any(healthy)),
        f"{sum(healthy)} of {len(healthy)} deployments meet all four thresholds at one load",
        f"{sum(healthy)} of {len(healthy)} deployments meet all four at one load. " + ". ".join(texts) + closing)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(NAME, __doc__.split("\n\n")[0], argv)
    if args.quick:
        workload, fractions = azure_conv(300), [0.3, 0.9]
    else:
        workload, fractions = azure_conv(3000), [0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1]
    table = sweep(workload, fractions)
    files = [write_csv(table, args.out, NAME), write_png(plot(table), args.out, NAME)]
    print(f"{len(workload)} requests of {workload.name}; loads {fractions} of saturation")
    report(verdicts(table), args.out, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
