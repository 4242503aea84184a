"""Config search (Vidur-Search's job): for each deployment, the highest request rate it serves
within latency SLOs.

A rate is the workload replayed faster or slower (`Workload.at_rate`: the trace's timestamps
compressed or stretched; a length-only trace gets Poisson arrivals). A run meets the SLOs when
every request finished (none rejected) and the p99 TTFT and p99 TPOT of the finished requests
are within their targets. The highest such rate is found by bracketing, then bisection:

1. a cheap bound: the throughput with the first 1,000 requests queued at t=0 (the deployment's
   capacity; one short run). A latency SLO is met somewhat below it: the first rate tried is
   85% of it;
2. a bracket out from there: up (or down) by 1.2, then 1.2**2, 1.2**4, ... until one end meets
   the SLOs and the other misses them;
3. bisection at the geometric mean until top / bottom <= 1 + rtol (2% by default).

A failing run stops as soon as its p99s are sure to miss (`sim.slo.SLOWatch`, exact), so runs
far past the knee cost little.

The answer is the bottom: a rate measured to meet the SLOs, within rtol of one measured to
miss them (exact if meeting the SLOs is monotone in the rate, which queueing makes it in all
but pathological traces). A deployment whose model does not fit its GPUs ("does not fit"),
or that cannot be built (a tp that does not split the model's heads: "not valid"), is reported as
infeasible with the reason; one that misses the SLOs even at 1e-5 of its capacity gets a max rate of 0, and one
that meets them even at 1e5 times its capacity gets that rate and an open bracket (inf).

Runs are shared where they are the same simulation: with one replica the router never acts, so
deployments that differ only by their router are searched once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from paged.core.validation import is_number, require
from paged.workloads.workload import Workload

from .hardware import get_hardware
from .memory import DoesNotFit
from .parallel import ordered_map
from .prices import gpu_hour_usd
from .sim_config import SimConfig
from .slo import SLO

SATURATION_SCALE = 1e-12  # every request arrives at (about) t=0
CAPACITY_SAMPLE = 1000  # requests of the capacity run
GUESS = 0.85  # the first rate tried, as a share of the capacity
BRACKET_STEP = 1.2  # the bracket's first step out from the guess (then squared at each step)
DEPLOYMENT_KEYS = ("model", "hardware", "tp", "replicas", "router", "max_num_seqs")


@dataclass(frozen=True, slots=True)
class SearchTask:
    config: SimConfig
    slo: SLO
    rtol: float = 0.02
    max_steps: int = 6  # steps out from the guess: at most 1.2**63 (10**5) times away

    def __post_init__(self) -> None:  # at rtol <= 0 the bisection would never end
        require(is_number(self.rtol) and 0 < self.rtol < math.inf, "SearchTask", "rtol", self.rtol,
                "a finite value > 0")


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
    lo = hi = GUESS * cap
    step = BRACKET_STEP
    if probe(lo):
        for _ in range(task.max_steps):
            hi = lo * step
            if not probe(hi):
                break
            lo, step = hi, step * step
        else:  # met even far above capacity: the SLOs are looser than the trace's queueing
            return row(lo, math.inf)
    else:
        for _ in range(task.max_steps):
            lo = hi / step
            if probe(lo):
                break
            hi, step = lo, step * step
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
        build_cache_config(c)  # the memory plan: raises when the model does not fit, or tp cannot split it
    except ValueError as e:
        infeasible = "does not fit" if isinstance(e, DoesNotFit) else "not valid"
        return {**row, "feasible": False, "max_qps": math.nan, "num_runs": 0, "infeasible": infeasible,
                "reason": str(e)}
    return {**row, "feasible": True, **max_rate(workload, task), "infeasible": "", "reason": ""}


def _run_key(config: SimConfig) -> str:
    """Equal for configs whose runs are identical: one replica ignores its router."""
    return repr(replace(config, router="round_robin") if config.replicas == 1 else config)


def search(workload: Workload, configs: list[SimConfig], slo: SLO, *, rtol: float = 0.02,
           prices: dict[str, float] | None = None, backend: str = "processes", workers: int | None = None,
           address: str | None = None, progress: bool = False):
    """Every deployment's max rate within the SLOs, one row each in the order given, with
    QPS per GPU and per dollar-hour (`prices`: USD per GPU-hour by hardware, over `sim.prices`)."""
    import pandas as pd

    keys = [_run_key(c) for c in configs]
    first: dict[str, int] = {}  # key -> the first config with it: the one searched
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    tasks = [SearchTask(configs[i], slo, rtol) for i in first.values()]
    found = dict(zip(first, ordered_map(search_one, workload, tasks, backend=backend, workers=workers,
                                        address=address, progress="deployments" if progress else None), strict=True))
    rows = []
    for i, (c, k) in enumerate(zip(configs, keys, strict=True)):
        # a spec file's GPU goes by its spec's name, not the file's path
        row = {**found[k], "router": c.router, "hardware": get_hardware(c.hardware).name}
        if first[k] != i:
            row["num_runs"] = 0  # its runs are those of the config searched
        rows.append(row)
    df = pd.DataFrame(rows)
    df["qps_per_gpu"] = df.max_qps / df.gpus
    df["usd_per_hour"] = [gpu_hour_usd(c.hardware, prices) * g for c, g in zip(configs, df.gpus, strict=True)]
    df["qps_per_usd_hour"] = df.max_qps / df.usd_per_hour
    return df
