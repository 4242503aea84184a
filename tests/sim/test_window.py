"""The fast path's closed forms against plain step-by-step sums."""
import hypothesis.strategies as st
from hypothesis import given

from sim.itl_histogram import add_window_to_histogram, itl_bin
from sim.window import envelope, first_reaching, span, step_duration, steps_within

lines_st = st.lists(st.tuples(st.integers(1, 10**9), st.integers(0, 10**6)), min_size=1, max_size=3)


@given(lines_st, st.integers(1, 300), st.data())
def test_closed_forms_match_stepping(lines, k, data):
    d = [step_duration(lines, j) for j in range(k)]
    segs = envelope(lines)
    for j in range(k):  # the envelope is the maximum, segment by segment
        js, a, b = [s for s in segs if s[0] <= j][-1]
        assert a + b * j == d[j]
    starts = [0]
    for x in d:
        starts.append(starts[-1] + x)
    assert [span(segs, n) for n in range(k + 1)] == starts
    target = data.draw(st.integers(1, starts[-1] + 10))
    assert first_reaching(segs, target, k) == next((n for n in range(1, k + 1) if starts[n] >= target), k)
    budget = data.draw(st.integers(0, starts[-1] + 10))
    assert steps_within(segs, budget, k) == max(n for n in range(k + 1) if starts[n] <= budget)


@given(lines_st, st.integers(1, 200), st.integers(1, 64))
def test_histogram_of_a_window_matches_stepping(lines, n, weight):
    hist, want = {}, {}
    longest = add_window_to_histogram(hist, lines, n, weight)
    for j in range(n):
        b = itl_bin(step_duration(lines, j))
        want[b] = want.get(b, 0) + weight
    assert hist == want
    assert longest == max(step_duration(lines, j) for j in range(n))
