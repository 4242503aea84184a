"""What a run writes while it goes: per-request columns and time-series samples.

Per-request results go into preallocated numpy columns the moment a request finishes (or is
rejected), so memory stays flat however long the trace: no `Request` outlives its stay in
the scheduler. Time series are sampled on a fixed grid of simulated time, not per token.
"""
from __future__ import annotations

import numpy as np

from paged.core.request import Request

from .clock import TICKS_PER_S, to_ticks

TIMESERIES_COLUMNS = ("time_s", "kv_usage", "kv_tokens", "fragmentation", "num_running", "num_waiting",
                      "num_swapped", "batch_tokens")


class RequestLog:
    """One row per workload request, filled in when it leaves the system."""

    __slots__ = ("arrival_s", "first_scheduled_s", "first_token_s", "last_token_s", "finished_s", "max_itl_s",
                 "num_generated", "num_preemptions", "prefix_hit_tokens", "status", "replica", "itl_s", "watch",
                 "frontend_latency_ticks")

    def __init__(self, n: int, record_itl: bool = False, frontend_latency_ticks: int = 0) -> None:
        # The arrival time as the client saw it: the scheduler's (on the tick grid) less the front
        # end's latency (`SimConfig.frontend_latency_s`), so that differences with the times it
        # recorded are exact.
        self.frontend_latency_ticks = frontend_latency_ticks
        self.arrival_s = np.full(n, np.nan)
        self.first_scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.last_token_s = np.full(n, np.nan)  # its client's last token: before finished_s in a static batch
        self.finished_s = np.full(n, np.nan)
        self.max_itl_s = np.full(n, np.nan)  # longest inter-token latency (requests of 2+ tokens)
        self.num_generated = np.zeros(n, dtype=np.int32)
        self.num_preemptions = np.zeros(n, dtype=np.int32)
        self.prefix_hit_tokens = np.zeros(n, dtype=np.int32)
        self.status = np.full(n, -1, dtype=np.int8)  # a paged.RequestStatus value once done
        self.replica = np.full(n, -1, dtype=np.int16)
        # every inter-token latency of every request, when asked for (a float array per request)
        self.itl_s: list[np.ndarray | None] | None = [None] * n if record_itl else None
        self.watch = None  # a sim.slo.SLOWatch, told of each request recorded

    def record(self, req: Request, replica: int, last_token_s: float | None, max_itl_s: float = np.nan) -> None:
        i = int(req.request_id)
        self.max_itl_s[i] = max_itl_s
        self.arrival_s[i] = (to_ticks(req.arrival_time) - self.frontend_latency_ticks) / TICKS_PER_S
        if req.first_scheduled_time is not None:
            self.first_scheduled_s[i] = req.first_scheduled_time
        if req.first_token_time is not None:
            self.first_token_s[i] = req.first_token_time
        if req.finished_time is not None:
            self.finished_s[i] = req.finished_time
        if last_token_s is not None:
            self.last_token_s[i] = last_token_s
        self.num_generated[i] = req.num_output_tokens
        self.num_preemptions[i] = req.num_preemptions
        self.prefix_hit_tokens[i] = max(req.num_cached_tokens, 0)
        self.status[i] = req.status
        self.replica[i] = replica
        if self.watch is not None:
            self.watch.left(req, self.arrival_s[i], self.last_token_s[i])


class TimeSeries:
    """Samples of one replica's state at times 0, dt, 2*dt, ... (ticks), at most `max_rows` of
    them: a run that outlasts what the memory check foresaw keeps every second sample and
    doubles dt (`coarsened` counts how often) rather than exhaust the machine's memory."""

    __slots__ = ("interval", "next_tick", "rows", "max_rows", "coarsened")

    def __init__(self, interval_ticks: int, max_rows: int) -> None:
        self.interval = interval_ticks
        self.next_tick = 0
        self.rows: list[tuple] = []
        self.max_rows = max_rows
        self.coarsened = 0

    def fill(self, now: int, row: tuple) -> None:
        """Record `row` (the state, unchanged since the last event) at every sample time before `now`."""
        while len(self.rows) + -(-(now - self.next_tick) // self.interval) > self.max_rows:
            self.rows = self.rows[::2]  # the samples at 0, 2 dt, 4 dt, ...: the doubled grid
            self.interval *= 2
            self.next_tick = -(-self.next_tick // self.interval) * self.interval
            self.coarsened += 1
        rows, tick, interval = self.rows, self.next_tick, self.interval
        while tick < now:
            rows.append((tick / TICKS_PER_S, *row))
            tick += interval
        self.next_tick = tick

    def columns(self) -> dict[str, np.ndarray]:
        data = np.array(self.rows, dtype=np.float64).reshape(-1, len(TIMESERIES_COLUMNS))
        return {c: data[:, i] for i, c in enumerate(TIMESERIES_COLUMNS)}
