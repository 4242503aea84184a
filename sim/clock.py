"""Simulated time as integer picoseconds ("ticks"), and the event loop that keeps it.

Integer time makes the fast path exact by construction: the duration of k decode steps is a
sum of integers, so it can be computed in closed form and still equal, bit for bit, the time
reached by adding the k step durations one at a time. Floats would round differently.
One tick is 1 ps: far below any step time, and 2**63 ticks is 106 days of simulated time.

Ties: a request arriving at exactly the time a step ends is seen by the next `schedule()`.
Arrivals are therefore URGENT, so that at equal times they are processed before any
replica's step event, however the events were queued; other events at equal times run in the
order they were queued.

The loop is a heap of callbacks, not a process framework (the simulator used simpy, whose
per-event generators, event objects and import were a fifth of a run): the replicas and the
arrivals are the only actors, and each knows what it waits for.
"""
from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from itertools import count

TICKS_PER_S = 10**12
# Arrivals are held as int64 ticks: a trace may span half the range (53 days), leaving the
# other half for the work still running after its last arrival.
MAX_TRACE_SPAN_S = 2**62 / TICKS_PER_S
URGENT, NORMAL = 0, 1
NEVER = 1 << 63  # later than any tick


def to_ticks(seconds: float) -> int:
    return round(seconds * TICKS_PER_S)


class EventLoop:
    """Callbacks run in (tick, priority, order queued); `now` is the tick of the one running."""

    __slots__ = ("now", "_queue", "_order")

    def __init__(self) -> None:
        self.now = 0
        self._queue: list[tuple[int, int, int, Callable[[], None]]] = []
        self._order = count()

    def at(self, tick: int, callback: Callable[[], None], priority: int = NORMAL) -> None:
        """Run `callback()` at `tick` (>= now)."""
        heappush(self._queue, (tick, priority, next(self._order), callback))

    def next_tick(self) -> int:
        """The tick of the next queued callback (NEVER when none). An actor whose next event
        comes strictly before it may run that event at once, setting `now` itself: nothing else
        could run in between, so the order is the one queuing it would give."""
        q = self._queue
        return q[0][0] if q else NEVER

    def run(self) -> None:
        """Run callbacks until none is left (an exception from one stops the loop at its tick)."""
        q = self._queue
        while q:
            tick, _, _, callback = heappop(q)
            self.now = tick
            callback()
