"""Config search (Vidur-Search's job): for each deployment, the highest request rate it serves
within latency SLOs.

A rate is the workload replayed faster or slower (`Workload.at_rate`: the trace's timestamps
compressed or stretched; a length-only trace gets Poisson arrivals). A run meets the SLOs when
every request finished (none rejected) and the p99 TTFT and p99 TPOT of the finished requests
are within their targets. The highest such rate is found by bracketing, then bisection:

1. a cheap bound: the throughput with the first 1,000 requests queued at t=0 (the deployment's
   capacity; one short run). No rate far above it can meet a latency SLO, so it starts the bracket's top, and
   half of it the bottom;
2. each end is checked by a run and moved out (x2 up, /2 down) until the top fails and the
   bottom passes;
3. bisection at the geometric mean until top / bottom <= 1 + rtol (2% by default).

A failing run stops as soon as its p99s are sure to miss (`sim.slo.SLOWatch`, exact), so runs
far past the knee cost little.

The answer is the bottom: a rate measured to meet the SLOs, within rtol of one measured to
miss them (exact if meeting the SLOs is monotone in the rate, which queueing makes it in all
but pathological traces). A deployment whose model does not fit its GPUs is reported as
infeasible; one that misses the SLOs even at 1/1024 of its capacity gets a max rate of 0, and
one that meets them even at 2**10 times its capacity gets that rate and an open bracket (inf).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from paged.workloads.workload import Workload

from .parallel import ordered_map
from .prices import gpu_hour_usd
from .sim_config import SimConfig
from .slo import SLO

SATURATION_SCALE = 1e-12  # every request arrives at (about) t=0
CAPACITY_SAMPLE = 1000  # requests of the capacity run
DEPLOYMENT_KEYS = ("model", "hardware", "tp", "replicas", "router", "max_num_seqs")


@dataclass(frozen=True, slots=True)
class SearchTask:
    config: SimConfig
    slo: SLO
    rtol: float = 0.02
    max_steps: int = 10  # each end moves at most 2**10 times away from its start


def capacity(workload: Workload, config: SimConfig) -> float:
    """Requests per second served with the first CAPACITY_SAMPLE requests queued at t=0 (a
    bracket's start only: the answer stands on the runs, not on this)."""
    from .runner import simulate

    sample = workload.head(min(len(workload), CAPACITY_SAMPLE)).scale_time(SATURATION_SCALE)
    return float(simulate(sample, config).summary()["throughput_req_s"])


def max_rate(workload: Workload, task: SearchTask) -> dict:
    """The search for one deployment: max_qps, the bracket [max_qps, bracket_hi), its runs, and
    the p99 latencies measured at max_qps."""
    from .runner import simulate

    runs: dict[float, dict] = {}

    def probe(qps: float) -> bool:
        if qps not in runs:
            runs[qps] = simulate(workload.at_rate(qps), task.config, stop_on_miss=task.slo).summary()
        return task.slo.met_by(runs[qps])

    def row(qps: float, hi: float) -> dict:
        best = runs.get(qps, {"ttft_s": {"p99": math.nan}, "tpot_s": {"p99": math.nan}})
        return {"max_qps": qps, "bracket_hi": hi, "capacity_qps": cap, "num_runs": len(runs) + 1,
                "ttft_s_p99": best["ttft_s"]["p99"], "tpot_s_p99": best["tpot_s"]["p99"]}

    cap = capacity(workload, task.config)
    hi, lo = cap, cap / 2
    for _ in range(task.max_steps):
        if not probe(hi):
            break
        lo, hi = hi, 2 * hi
    else:  # met even far above capacity: the SLOs are looser than the trace's queueing
        return row(lo, math.inf)
    for _ in range(task.max_steps):
        if probe(lo):
            break
        hi, lo = lo, lo / 2
    else:
        return row(0.0, lo)
    while hi > lo * (1 + task.rtol):
        mid = math.sqrt(lo * hi)
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return row(lo, hi)


def search_one(workload: Workload, task: SearchTask) -> dict:
    """One row: the deployment, its GPUs, and its max rate (or why it cannot run)."""
    from .runner import build_cache_config

    c = task.config
    row = {k: getattr(c, k) for k in DEPLOYMENT_KEYS}
    row["gpus"] = c.tp * c.replicas
    try:
        build_cache_config(c)  # the memory plan: raises when the model does not fit
    except ValueError as e:
        return {**row, "feasible": False, "max_qps": math.nan, "reason": str(e)}
    return {**row, "feasible": True, **max_rate(workload, task), "reason": ""}


def search(workload: Workload, configs: list[SimConfig], slo: SLO, *, rtol: float = 0.02,
           prices: dict[str, float] | None = None, backend: str = "processes", workers: int | None = None,
           address: str | None = None, progress: bool = False):
    """Every deployment's max rate within the SLOs, one row each in the order given, with
    QPS per GPU and per dollar-hour (`prices`: USD per GPU-hour by hardware, over `sim.prices`)."""
    import pandas as pd

    tasks = [SearchTask(c, slo, rtol) for c in configs]
    rows = ordered_map(search_one, workload, tasks, backend=backend, workers=workers, address=address,
                       progress="deployments" if progress else None)
    df = pd.DataFrame(rows)
    df["qps_per_gpu"] = df.max_qps / df.gpus
    df["usd_per_hour"] = [gpu_hour_usd(h, prices) * g for h, g in zip(df.hardware, df.gpus, strict=True)]
    df["qps_per_usd_hour"] = df.max_qps / df.usd_per_hour
    return df
