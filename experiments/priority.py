"""The article's dynamic priority (a*wait_time + b*expected_latency + c*business_value, with
preemption) against first come, first served, when some requests are worth more than others.

Under light load every order serves everyone at once and priority cannot matter; under
overload someone waits, and the policy decides who. The formula's wait term ages every waiting
request, so a high business value buys a head start of c*value/a seconds, not a place at the
front forever: low-value requests are delayed, never starved. Preemption lets a valuable
arrival take a running request's memory instead of waiting for it to finish.

Setup: the Azure conversation trace with 10% of requests (drawn at random, seed 0) worth a
30-second head start (business_value 30, a = c = 1, b = 0), Llama-2-7B on one A100-80GB, at
loads below, near and above what it serves (about 5.3 req/s). The SLO is the article's chat
health threshold: time to first token under 1 s.
"""
from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import pandas as pd
from common import Verdict, at_load, azure_conv, outcome, parse_args, percent, report, write_csv, write_png

from paged.core.policies import FCFS, Priority
from sim import SimConfig, Workload, simulate
from sim.plots import figure, legend_below, look

NAME = "priority"
PREMIUM_SHARE, PREMIUM_VALUE = 0.10, 30.0
TTFT_SLO_S = 1.0
POLICIES = {"fcfs": FCFS(), "priority + preemption": Priority(a=1.0, b=0.0, c=1.0),
            "priority, no preemption": Priority(a=1.0, b=0.0, c=1.0, preemptive=False)}


def with_values(workload: Workload) -> tuple[Workload, np.ndarray]:
    premium = np.random.default_rng(0).random(len(workload)) < PREMIUM_SHARE
    return replace(workload, business_value=np.where(premium, PREMIUM_VALUE, 0.0)), premium


def run(workload: Workload, premium: np.ndarray, qps: float, policy: str) -> list[dict]:
    result = simulate(at_load(workload, qps), SimConfig(policy=POLICIES[policy]))
    s = result.summary()
    ttft = result.latency_columns()["ttft_s"]
    done = result.finished_mask()
    rows = []
    for cls, mask in (("premium", premium), ("standard", ~premium)):
        t = ttft[mask & done]
        p50, p90, p99 = np.percentile(t, [50, 90, 99])
        rows.append({"offered_qps": qps, "policy": policy, "class": cls, "num_requests": int(mask.sum()),
                     "ttft_s_p50": p50, "ttft_s_p90": p90, "ttft_s_p99": p99, "ttft_s_max": t.max(),
                     "slo_attainment": np.mean(ttft[mask] <= TTFT_SLO_S),  # unfinished requests miss it
                     "throughput_req_s": s["throughput_req_s"], "num_preemptions": s["num_preemptions"]})
    return rows


def plot(table: pd.DataFrame):
    fig, axes = figure(1, 3)
    panels = ((axes[0, 0], "premium", "slo_attainment", f"TTFT <= {TTFT_SLO_S:g} s (% of requests)",
               f"premium ({percent(PREMIUM_SHARE)}): within SLO"),
              (axes[0, 1], "standard", "ttft_s_p90", "TTFT p90 (s)", "standard: what priority costs"),
              (axes[0, 2], "standard", "ttft_s_max", "longest TTFT (s)", "standard: the longest wait"))
    for ax, cls, col, ylabel, title in panels:
        for policy in POLICIES:
            d = table[(table["class"] == cls) & (table.policy == policy)]
            ax.plot(d.offered_qps, 100 * d[col] if col == "slo_attainment" else d[col], label=policy, **look(policy))
        ax.set(xlabel="offered load (req/s)", ylabel=ylabel, title=title)
    axes[0, 0].set_ylim(0, 101)
    legend_below(fig, axes, ncol=3)
    fig.suptitle(f"Dynamic priority ({PREMIUM_VALUE:g} s head start for {percent(PREMIUM_SHARE)} of requests) vs "
                 "FCFS:\nAzure conversation trace, Llama-2-7B on one A100-80GB")
    return fig


def verdicts(table: pd.DataFrame) -> list[Verdict]:
    t = table.set_index(["offered_qps", "policy", "class"])
    fcfs, prio = "fcfs", "priority + preemption"
    light = table[table.offered_qps == table.offered_qps.min()]
    loads = sorted(table.offered_qps.unique())
    contended = [q for q in loads if t.loc[(q, fcfs, "premium"), "slo_attainment"] < 0.95] or loads[-1:]
    helps = all(t.loc[(q, prio, "premium"), "slo_attainment"] > t.loc[(q, fcfs, "premium"), "slo_attainment"]
                for q in contended)
    starve = max(t.loc[(q, prio, "standard"), "ttft_s_max"] / t.loc[(q, fcfs, "standard"), "ttft_s_max"]
                 for q in contended)

    def figures(q: float, policy: str) -> str:
        p, s = t.loc[(q, policy, "premium")], t.loc[(q, policy, "standard")]
        return (f"{policy}: premium {percent(p.slo_attainment)} within SLO (p90 {p.ttft_s_p90:.2f} s), standard "
                f"{percent(s.slo_attainment)} (p90 {s.ttft_s_p90:.1f} s, longest {s.ttft_s_max:.0f} s), "
                f"{int(p.num_preemptions)} preemptions, {p.throughput_req_s:.2f} req/s")

    q = contended[-1]
    cost = t.loc[(q, prio, "standard"), "ttft_s_p90"], t.loc[(q, fcfs, "standard"), "ttft_s_p90"]
    headline = (f"at {q:g} req/s premium meets the SLO {percent(t.loc[(q, prio, 'premium'), 'slo_attainment'])} "
                f"vs {percent(t.loc[(q, fcfs, 'premium'), 'slo_attainment'])}; standard p90 TTFT "
                f"{cost[1]:.1f} -> {cost[0]:.1f} s")
    text = " | ".join(f"{q:g} req/s: " + "; ".join(figures(q, policy) for policy in POLICIES) for q in contended)
    return [Verdict("Priority = a*wait + b*expected_latency + c*business_value, with preemption, serves value first",
                    outcome(helps and starve < 1.5, partly=helps), headline,
                    f"{text}. The longest standard wait grows at most x{starve:.2f}: aging bounds it, and once queues "
                    f"are longer than the {PREMIUM_VALUE:g} s head start, premium requests queue too. At "
                    f"{light.offered_qps.min():g} req/s every policy meets the SLO for at "
                    f"least {percent(light.slo_attainment.min())} of requests: priority matters only when someone "
                    "waits.")]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(NAME, __doc__.split("\n\n")[0], argv)
    workload, premium = with_values(azure_conv(300 if args.quick else 1500))
    loads = [8.0] if args.quick else [3.0, 4.5, 6.0, 8.0]
    table = pd.DataFrame([row for qps in loads for policy in POLICIES for row in run(workload, premium, qps, policy)])
    files = [write_csv(table, args.out, NAME), write_png(plot(table), args.out, NAME)]
    print(f"{len(workload)} requests of {workload.name} ({premium.sum()} premium); loads {loads} req/s")
    report(verdicts(table), args.out, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
