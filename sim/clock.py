"""Simulated time as integer picoseconds ("ticks"), and arrivals that win ties.

Integer time makes the fast path exact by construction: the duration of k decode steps is a
sum of integers, so it can be computed in closed form and still equal, bit for bit, the time
reached by adding the k step durations one at a time. Floats would round differently.
One tick is 1 ps: far below any step time, and 2**63 ticks is 106 days of simulated time.

Ties: a request arriving at exactly the time a step ends is seen by the next `schedule()`.
Arrivals are therefore scheduled with simpy's URGENT priority, so that at equal times they
are processed before any replica's step event, however the events were created.

`Environment.try_advance` lets a replica whose step ends strictly before the next queued event run
the next step at once instead of yielding a Timeout: nothing else could run in between, so the
order is the one the Timeout would give, without the event's cost.
"""
from __future__ import annotations

import simpy
from simpy.core import URGENT
from simpy.events import Timeout

TICKS_PER_S = 10**12
# Arrivals are held as int64 ticks: a trace may span half the range (53 days), leaving the
# other half for the work still running after its last arrival.
MAX_TRACE_SPAN_S = 2**62 / TICKS_PER_S


def to_ticks(seconds: float) -> int:
    return round(seconds * TICKS_PER_S)


class Environment(simpy.Environment):
    """simpy's environment, whose clock an actor may move to a time before the next queued event."""

    def try_advance(self, tick: int) -> bool:
        """Move `now` to `tick` if it comes strictly before the next queued event (True): as if a
        Timeout to it had been the next event processed. Else change nothing (False): the caller
        yields a Timeout. One look at the queue, once a step."""
        queue = self._queue
        if queue and tick >= queue[0][0]:
            return False
        if tick < self._now:
            raise ValueError(f"try_advance({tick}): a time before now={self._now} (a negative step duration?)")
        self._now = tick
        return True


class UrgentTimeout(Timeout):
    """A timeout processed before ordinary events due at the same time."""

    def __init__(self, env: simpy.Environment, delay: int) -> None:
        # Timeout.__init__ hard-codes NORMAL priority; this is its body with URGENT.
        self.env = env
        self.callbacks = []
        self._value = None
        self._delay = delay
        self._ok = True
        env.schedule(self, URGENT, delay)
