"""The inter-token latency distribution of a whole run, as a log histogram {bin: tokens}.

Every token a decode step produces has that step's duration as its inter-token latency, so a
window of k identical-shape steps adds k durations at once: the fast path never visits tokens
one by one. Bins are 1% wide, which bounds the error of any percentile read back at 0.5%.
"""
from __future__ import annotations

import math

from .window import step_duration

_LOG_BIN = 1 / math.log(1.01)  # histogram bins 1% wide


def itl_bin(ticks: int) -> int:
    """Bin of a duration in a log histogram with 1%-wide bins."""
    return int(math.log(ticks) * _LOG_BIN)


def bin_value(b: int) -> float:
    """The geometric middle of bin b, in ticks."""
    return math.exp((b + 0.5) / _LOG_BIN)


def add_window_to_histogram(hist: dict[int, int], lines: list[tuple[int, int]], n: int, weight: int) -> int:
    """Add steps 0..n-1, `weight` tokens each, to a log histogram {bin: tokens}. Durations never
    decrease, so each bin holds a run of consecutive steps, found by bisection. Returns the
    window's longest step, the first or the last (worked out here anyway: the caller needs it)."""
    first, last = step_duration(lines, 0), step_duration(lines, n - 1)
    longest = first if first > last else last
    last_bin = itl_bin(last)
    b = itl_bin(first)
    if b == last_bin:  # the common case: the whole window within 1%
        hist[b] = hist.get(b, 0) + n * weight
        return longest
    j = 0
    while j < n:
        b = itl_bin(step_duration(lines, j))
        if b == last_bin:
            hist[b] = hist.get(b, 0) + (n - j) * weight
            return longest
        lo, hi = j, n - 1  # the last step in bin b lies in [lo, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if itl_bin(step_duration(lines, mid)) == b:
                lo = mid
            else:
                hi = mid
        hist[b] = hist.get(b, 0) + (lo - j + 1) * weight
        j = lo + 1
    return longest
