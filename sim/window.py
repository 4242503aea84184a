"""Closed-form arithmetic over k steps of a fixed decode batch (the fast path's clock).

While the batch is fixed, step j takes d(j) = max over lines (a + b*j) ticks (see
`CostModel.decode_lines`; b >= 0, so d never decreases). The upper envelope of the lines is
at most one segment per line, each an arithmetic progression, so the time k steps take and
the first step that starts at or after a given time are computed in O(number of lines),
whatever k is: the simulator thinks in events, not iterations. All integers, hence exact.
"""
from __future__ import annotations

import math


def envelope(lines: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """The upper envelope of the lines over j >= 0, as segments (first j, a, b)."""
    if len(lines) == 1:
        return [(0, *lines[0])]
    cur = max(lines)  # largest a, then largest b: the line on top from j = 0 onwards
    segs = [(0, cur[0], cur[1])]
    j = 0
    while True:
        # The next line to rise above the current one does so at the earliest crossing.
        nxt = None
        for a, b in lines:
            if b > cur[1]:
                jq = (cur[0] + cur[1] * j - a - b * j) // (b - cur[1]) + 1 + j
                if nxt is None or jq < nxt:
                    nxt = jq
        if nxt is None:
            return segs
        j = nxt
        cur = max(lines, key=lambda ln: (ln[0] + ln[1] * j, ln[1]))
        segs.append((j, cur[0], cur[1]))


def span(segs: list[tuple[int, int, int]], n: int) -> int:
    """Ticks taken by steps 0..n-1."""
    total = 0
    last = len(segs) - 1
    for i, (js, a, b) in enumerate(segs):
        if js >= n:
            break
        je = min(segs[i + 1][0], n) if i < last else n
        m = je - js
        total += m * a + b * ((js + je - 1) * m // 2)
    return total


def first_reaching(segs: list[tuple[int, int, int]], target: int, k: int) -> int:
    """The smallest n in [1, k] with span(n) >= target (target >= 1), or k if there is none."""
    acc = 0
    last = len(segs) - 1
    for i, (js, a, b) in enumerate(segs):
        if js >= k:
            break
        je = min(segs[i + 1][0], k) if i < last else k
        m_max = je - js
        a0 = a + b * js  # duration of the segment's first step
        seg = m_max * a0 + b * (m_max * (m_max - 1) // 2)
        if acc + seg >= target:
            rest = target - acc  # the smallest m with m*a0 + b*m(m-1)/2 >= rest
            if b == 0:
                m = -(-rest // a0)
            else:
                lin = 2 * a0 - b
                m = -(-(math.isqrt(lin * lin + 8 * b * rest) - lin) // (2 * b))
                while m * a0 + b * (m * (m - 1) // 2) < rest:
                    m += 1
                while m > 1 and (m - 1) * a0 + b * ((m - 1) * (m - 2) // 2) >= rest:
                    m -= 1
            return js + max(m, 1)
        acc += seg
    return k


def steps_within(segs: list[tuple[int, int, int]], budget: int, k: int) -> int:
    """The largest n in [0, k] with span(n) <= budget."""
    if budget < 1:
        return 0
    n = first_reaching(segs, budget + 1, k)
    return n if n == k and span(segs, k) <= budget else n - 1


def step_duration(lines: list[tuple[int, int]], j: int) -> int:
    """max(a + b*j) over the lines, in a plain loop (a generator under max() costs more than the lines)."""
    best = None
    for a, b in lines:
        d = a + b * j
        if best is None or d > best:
            best = d
    return best
