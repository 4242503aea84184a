"""Grids of runs: one row of summary figures per configuration.

Local processes (concurrent.futures) by default; Ray when asked for and installed (it is
imported only then; `sim.parallel`). Rows come back in the order of the configurations, whatever order the
runs finish in, so a sweep is as deterministic as a single run.
"""
from __future__ import annotations

import itertools
from dataclasses import replace

from paged.workloads.workload import Workload

from .parallel import ordered_map
from .sim_config import SimConfig


def grid(base: SimConfig | None = None, **axes) -> list[SimConfig]:
    """The cartesian product of the given SimConfig fields' values:
    `grid(replicas=[1, 2], router=["round_robin", "least_kv"])` is four configs."""
    base = base or SimConfig()
    unknown = sorted(set(axes) - set(SimConfig.field_names()))
    if unknown:
        raise ValueError(f"grid: unknown SimConfig field(s) {unknown}")
    names = list(axes)
    return [replace(base, **dict(zip(names, values, strict=True))) for values in itertools.product(*axes.values())]


def flatten(summary: dict) -> dict:
    """{"ttft_s": {"p99": x}} -> {"ttft_s_p99": x}"""
    row = {}
    for k, v in summary.items():
        if isinstance(v, dict):
            row.update({f"{k}_{q}": x for q, x in v.items()})
        else:
            row[k] = v
    return row


def run_one(workload: Workload, config: SimConfig) -> dict:
    from .runner import simulate

    return {**config.to_dict(), **flatten(simulate(workload, config).summary())}


def sweep(workload: Workload, configs: list[SimConfig], *, backend: str = "processes", max_workers: int | None = None,
          address: str | None = None, progress: bool = False):
    """Run every config on the workload; a pandas DataFrame with one row per config.
    `backend` "processes" or "ray" (`address`: a Ray cluster to join; see `sim.parallel`)."""
    import pandas as pd

    rows = ordered_map(run_one, workload, configs, backend=backend, workers=max_workers, address=address,
                       progress="sweep" if progress else None)
    return pd.DataFrame(rows)
