"""Grids of runs: one row of summary figures per configuration.

Local processes (concurrent.futures) by default; Ray when asked for and installed (it is
imported only then). Rows come back in the order of the configurations, whatever order the
runs finish in, so a sweep is as deterministic as a single run.
"""
from __future__ import annotations

import itertools
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from paged.workloads.workload import Workload

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


def sweep(workload: Workload, configs: list[SimConfig], *, backend: str = "processes", max_workers: int | None = None):
    """Run every config on the workload; a pandas DataFrame with one row per config."""
    import pandas as pd

    if backend == "processes":
        if max_workers == 1 or len(configs) == 1:
            rows = [run_one(workload, c) for c in configs]
        else:
            with ProcessPoolExecutor(max_workers=max_workers) as pool:
                rows = list(pool.map(run_one, [workload] * len(configs), configs))
    elif backend == "ray":
        try:
            import ray
        except ImportError:
            raise RuntimeError("backend='ray' needs Ray: pip install 'paged[ray]' (or pip install ray)") from None
        if not ray.is_initialized():
            ray.init(num_cpus=max_workers)
        remote = ray.remote(run_one)
        ref = ray.put(workload)
        rows = ray.get([remote.remote(ref, c) for c in configs])
    else:
        raise ValueError(f"backend={backend!r}: expected 'processes' or 'ray'")
    return pd.DataFrame(rows)
