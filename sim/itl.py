"""Each request's longest inter-token latency, without touching each request at each step.

While a request decodes, each of its inter-token latencies is the duration of one step of its
replica (steps run back to back while anything runs); while it is preempted, its next token
comes after one gap spanning all the steps it missed. So its longest latency is the longer of
its longest stall and the longest step since its first token. `LongestStepSince` answers the
second in O(log n): a stack of the steps that are longer than every step after them.
"""
from __future__ import annotations

from bisect import bisect_right


class LongestStepSince:
    __slots__ = ("_ends", "_durations")

    def __init__(self) -> None:
        self._ends: list[int] = []  # end ticks, increasing
        self._durations: list[int] = []  # strictly decreasing: each longer than all after it

    def add(self, end: int, duration: int) -> None:
        ends, durations = self._ends, self._durations
        while durations and durations[-1] <= duration:
            durations.pop()
            ends.pop()
        ends.append(end)
        durations.append(duration)

    def since(self, tick: int) -> int:
        """The longest step that ended after `tick` (0 if none)."""
        i = bisect_right(self._ends, tick)
        return self._durations[i] if i < len(self._durations) else 0
