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


_RECORDED = ("max_itl_s", "arrival_s", "first_scheduled_s", "first_token_s", "finished_s", "last_token_s",
             "num_generated", "num_preemptions", "prefix_hit_tokens", "status", "replica")
_CHUNK = 4096  # rows buffered before they are written into the columns


class RequestLog:
    """One row per workload request, filled in when it leaves the system. Rows are buffered and
    written a chunk at a time (`flush`): eleven numpy element writes per request cost more than
    one column write per chunk. The columns are complete once `flush` has run (`simulate` does)."""

    __slots__ = ("arrival_s", "first_scheduled_s", "first_token_s", "last_token_s", "finished_s", "max_itl_s",
                 "num_generated", "num_preemptions", "prefix_hit_tokens", "status", "replica", "itl_s", "watch",
                 "frontend_latency_ticks", "_rows")

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
        self._rows: list[tuple] = []

    def record(self, req: Request, replica: int, last_token_s: float | None, num_output_tokens: int,
               max_itl_s: float = np.nan) -> None:
        """A request left (once: finished or rejected); a time it never reached stays NaN.
        The caller passes `req.num_output_tokens`, which it has read already (a property call)."""
        nan = np.nan
        last = nan if last_token_s is None else last_token_s
        arrival = req.arrival_time  # t / TICKS_PER_S for an integer tick t
        if self.frontend_latency_ticks:
            arrival = (to_ticks(arrival) - self.frontend_latency_ticks) / TICKS_PER_S
        first_scheduled, first_token, finished = req.first_scheduled_time, req.first_token_time, req.finished_time
        self._rows.append((int(req.request_id), max_itl_s, arrival,
                           nan if first_scheduled is None else first_scheduled,
                           nan if first_token is None else first_token, nan if finished is None else finished,
                           last, num_output_tokens, req.num_preemptions,
                           req.num_cached_tokens if req.num_cached_tokens > 0 else 0,
                           int(req.status), replica))
        if len(self._rows) >= _CHUNK:
            self.flush()
        if self.watch is not None:
            self.watch.left(req, arrival, last)

    def flush(self) -> None:
        """Write the buffered rows into the columns."""
        if not self._rows:
            return
        index, *values = zip(*self._rows)
        rows = np.array(index, dtype=np.int64)
        for name, values_of in zip(_RECORDED, values, strict=True):
            column = getattr(self, name)  # values read straight into its dtype: no type discovery per value
            column[rows] = np.fromiter(values_of, dtype=column.dtype, count=len(values_of))
        self._rows = []


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
