"""One ordered parallel map for sweeps and searches: `fn(shared, item)` for every item, on local
processes or on a Ray cluster, the results in the order of the items whatever order the tasks
finish in (so a parallel sweep is as deterministic as a serial one).

`shared` (a workload) is sent once: to each process of the pool as the tasks carry it (pickled
with each task: cheap next to a simulation), to Ray once through its object store. Ray is
imported only when asked for: `address=None` starts a local Ray (or uses the one this process
already started), an address such as "auto" or "ray://head:10001" joins a cluster, whose
workers must be able to import `paged` and `sim`. The process pool too is imported only when a
map runs: `import sim` (every `python -m sim` command) does not pay for multiprocessing.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

BACKENDS = ("processes", "ray")


def ordered_map(fn: Callable, shared, items: Sequence, *, backend: str = "processes", workers: int | None = None,
                address: str | None = None, progress: str | None = None) -> list:
    """[fn(shared, item) for item in items], in parallel; `progress` names a tqdm bar (None: no bar)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {list(BACKENDS)}")
    bar = None
    if progress is not None:
        from tqdm import tqdm

        bar = tqdm(total=len(items), desc=progress, unit="task")
    try:
        if backend == "ray":
            return _ray_map(fn, shared, items, workers, address, bar)
        if workers == 1 or len(items) <= 1:
            out = []
            for item in items:
                out.append(fn(shared, item))
                _tick(bar)
            return out
        from concurrent.futures import ProcessPoolExecutor, as_completed

        results = [None] * len(items)
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(fn, shared, item): i for i, item in enumerate(items)}
            for f in as_completed(futures):
                results[futures[f]] = f.result()
                _tick(bar)
        return results
    finally:
        if bar is not None:
            bar.close()


def _tick(bar) -> None:
    if bar is not None:
        bar.update(1)


def _ray_map(fn: Callable, shared, items: Sequence, workers: int | None, address: str | None, bar) -> list:
    try:
        import ray
    except ImportError:
        raise RuntimeError("backend='ray' needs Ray: pip install 'paged[ray]' (or pip install ray)") from None
    if not ray.is_initialized():
        if address is None:
            ray.init(num_cpus=workers, include_dashboard=False)
        else:
            ray.init(address=address)
    remote = ray.remote(fn)
    ref = ray.put(shared)
    refs = [remote.remote(ref, item) for item in items]
    index = {r: i for i, r in enumerate(refs)}
    results = [None] * len(items)
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for r in done:
            results[index[r]] = ray.get(r)
            _tick(bar)
    return results
