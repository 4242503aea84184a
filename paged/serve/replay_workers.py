"""One replay shared by several processes, for loads one Python process cannot time.

Each streamed token costs the replaying process on the order of 0.1 ms of CPU (HTTP, SSE, JSON),
so one event loop tops out near ten thousand tokens a second, and its sends grow late well
before (the loop is busy when a request is due). With `workers` processes, worker w sends
requests w, w + workers, w + 2 * workers, ... of the same schedule, from one start time that the
parent sets once every worker is ready, and the parent merges their records.
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from paged.workloads.workload import Workload

from .replay import LEAD_S, PENDING, Records, replay

_SHARED: dict = {}
STARTUP_TIMEOUT_S = 120.0


def _init(ready, go, start, done) -> None:
    _SHARED.update(ready=ready, go=go, start=start, done=done)


def _count_done() -> None:
    with _SHARED["done"].get_lock():
        _SHARED["done"].value += 1


def _work(url: str, model: str, workload: Workload, prompt, indices: np.ndarray, timeout_s: float,
          sampling: dict | None):
    _SHARED["ready"].release()
    _SHARED["go"].wait()
    return asyncio.run(replay(url, model, workload, prompt, timeout_s, _count_done, indices.tolist(),
                              _SHARED["start"].value, sampling))


def merge(parts: list[Records], n: int) -> Records:
    """The records of a whole replay from those of its workers (each filled its own rows)."""
    out = Records(n)
    for part in parts:
        rows = np.flatnonzero(part.status != PENDING)
        for name in ("scheduled_s", "sent_s", "first_token_s", "finished_s", "num_generated", "status",
                     "cached_tokens"):
            getattr(out, name)[rows] = getattr(part, name)[rows]
        for i in rows:
            out.itl_s[i], out.error[i], out.backend[i] = part.itl_s[i], part.error[i], part.backend[i]
    return out


def _report(now_done: int, reported: int, on_done) -> int:
    if on_done is not None and now_done > reported:
        on_done(now_done - reported)
    return now_done


def replay_in_processes(url: str, model: str, workload: Workload, prompt, workers: int, timeout_s: float = 600.0,
                        on_done=None, sampling: dict | None = None) -> tuple[Records, float]:
    """`replay` in `workers` processes (1: in this one); the same records and length.
    `on_done(k)` is told of requests as they end, k at a time; `sampling` as `replay`'s."""
    if workers == 1:
        return asyncio.run(replay(url, model, workload, prompt, timeout_s, on_done, sampling=sampling))
    ctx = mp.get_context("spawn")  # not fork: the parent may run threads (a progress bar's)
    ready, go, start, done = ctx.Semaphore(0), ctx.Event(), ctx.Value("d", 0.0), ctx.Value("i", 0)
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init, initargs=(ready, go, start, done)) as pool:
        futures = [pool.submit(_work, url, model, workload, prompt, np.arange(w, len(workload), workers), timeout_s,
                               sampling)
                   for w in range(workers)]
        deadline, waiting = time.monotonic() + STARTUP_TIMEOUT_S, workers
        while waiting:
            if ready.acquire(timeout=0.1):
                waiting -= 1
            for f in futures:
                if f.done():
                    f.result()  # a worker that failed to start: its error
            if time.monotonic() > deadline:
                raise RuntimeError(f"the replay's worker processes did not start in {STARTUP_TIMEOUT_S:g} s")
        start.value = time.time() + LEAD_S
        go.set()
        reported = 0
        while reported < len(workload) and not all(f.done() for f in futures):
            time.sleep(0.1)
            reported = _report(done.value, reported, on_done)
        results = [f.result() for f in futures]
    _report(done.value, reported, on_done)
    return merge([r for r, _ in results], len(workload)), max(length for _, length in results)
