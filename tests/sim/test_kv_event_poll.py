"""kv_aware reading the replicas' KV events every so often, as the real router does."""
from dataclasses import replace

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from paged.workloads.conversations import ConversationShape, conversation_workload
from sim import SimConfig, simulate
from sim.clock import to_ticks
from sim.kv_event_poll import PolledKVEvents

from .strategies import sim_configs, workloads
from .test_fast_path import assert_identical


class Recorder:
    """A view that records what it is told, in order."""

    def __init__(self) -> None:
        self.calls = []

    def blocks_stored(self, hashes):
        self.calls.append(("stored", hashes))

    def blocks_removed(self, hashes):
        self.calls.append(("removed", hashes))

    def all_blocks_cleared(self):
        self.calls.append(("cleared", None))


def test_an_event_is_seen_at_the_first_read_after_it_in_order():
    clock = [0]
    view = Recorder()
    polled = PolledKVEvents(view, 100, lambda: clock[0])
    polled.blocks_stored(["a"])  # at 0: the read at 100 sees it, not one at 0
    clock[0] = 99
    polled.blocks_removed(["a"])
    clock[0] = 100
    polled.all_blocks_cleared()  # at a read's instant: the next read's
    polled.blocks_stored(["b"])
    polled.deliver(99)
    assert view.calls == []
    polled.deliver(100)
    assert view.calls == [("stored", ["a"]), ("removed", ["a"])]
    polled.deliver(199)
    assert len(view.calls) == 2
    polled.deliver(10_000)
    assert view.calls[2:] == [("cleared", None), ("stored", ["b"])] and not polled.pending
    with pytest.raises(ValueError, match="interval_ticks=0"):
        PolledKVEvents(view, 0, lambda: 0)


def test_a_run_routes_by_the_events_of_reads_before_each_arrival(monkeypatch):
    """In a simulation, each routing sees exactly the events emitted before the last read at or
    before it, and the views end equal to the pools' caches once every event is read."""
    seen = []
    queue, deliver = PolledKVEvents._queue, PolledKVEvents.deliver

    def spy_queue(self, method, *args):
        queue(self, method, *args)
        seen.append(("emitted", id(self), self.now(), self.pending[-1][0]))

    def spy_deliver(self, now):
        before = len(self.pending)
        deliver(self, now)
        next_read = self.pending[0][0] if self.pending else None
        seen.append(("delivered", id(self), now, before - len(self.pending), next_read))

    monkeypatch.setattr(PolledKVEvents, "_queue", spy_queue)
    monkeypatch.setattr(PolledKVEvents, "deliver", spy_deliver)
    interval = 0.05
    w = conversation_workload(ConversationShape(num_conversations=30, rate=4.0, think_time_s=0.5))
    r = simulate(w, replicas=2, router="kv_aware", num_gpu_blocks=300, kv_events_interval_s=interval)
    tick = to_ticks(interval)
    emitted = [s for s in seen if s[0] == "emitted"]
    assert emitted and all(read == (t // tick + 1) * tick for _, _, t, read in emitted)
    delivered = [s for s in seen if s[0] == "delivered"]
    assert len(delivered) == 2 * len(w)  # each routing reads both replicas' events first
    assert all(next_read is None or next_read > now for _, _, now, _, next_read in delivered)
    assert sum(n for _, _, _, n, _ in delivered) < len(emitted)  # some were still to be read at the end
    for s in r.schedulers:
        view = s.kv.pool.events
        view.deliver(10**30)
        assert view.view.hashes == set(s.kv.pool.cached)


def test_reading_late_changes_routing_and_nothing_else_reads_it():
    w = conversation_workload(ConversationShape(num_conversations=30, rate=1.0, think_time_s=2.0, mean_turns=6,
                                                system_prompt_tokens=1024, user_tokens=300))
    config = SimConfig(replicas=3, router="kv_aware", num_gpu_blocks=300)  # the cache evicts: views go stale
    # read every think time: the answers' blocks (no routing claimed them) and the evictions come late
    now, late = simulate(w, config), simulate(w, config, kv_events_interval_s=2.0)
    assert now.requests.replica.tolist() != late.requests.replica.tolist()
    lo = replace(config, router="least_outstanding")
    assert_identical(simulate(w, lo), simulate(w, lo, kv_events_interval_s=1.0))
    with pytest.raises(ValueError, match="kv_events_interval_s"):
        SimConfig(kv_events_interval_s=-0.25)


def test_no_window_runs_through_a_read(monkeypatch):
    """The fast path's windows end before the next read of the events: a window's evictions happen
    at its end, where one step at a time makes them at each step's start, and a read between the two
    would see them in one case and not the other."""
    from sim.replica import Replica

    windows = []
    begin = Replica._begin

    def spy(self, now):
        d = begin(self, now)
        if self._window is not None:
            windows.append((now, d, self.poll_ticks))
        return d

    monkeypatch.setattr(Replica, "_begin", spy)
    w = conversation_workload(ConversationShape(num_conversations=30, rate=1.0, think_time_s=2.0, mean_turns=6))
    # samples of the time series (which windows also end at) every second: not on the reads' grid
    simulate(w, replicas=2, router="kv_aware", num_gpu_blocks=300, kv_events_interval_s=0.15, timeseries_interval_s=1.0)
    tick = to_ticks(0.15)
    assert len(windows) > 100 and {p for _, _, p in windows} == {tick}
    assert all(now + d < (now // tick + 1) * tick for now, d, _ in windows)


@settings(max_examples=settings().max_examples * 4)
@given(workloads(), sim_configs(), st.sampled_from([0.0015, 0.0035, 0.013, 0.031]), st.integers(2, 3))
def test_the_fast_path_stays_exact_when_events_are_read_late(workload, config, interval, replicas):
    """A window ends before the next read, so the evictions it makes at its end are seen at the
    read its steps' own would be, and routing is the same one step at a time."""
    config = replace(config, router="kv_aware", replicas=replicas, kv_events_interval_s=interval,
                     enable_prefix_caching=True, timeseries_interval_s=1.0)  # samples off the reads' grid
    fast = simulate(workload, replace(config, fast_path=True))
    step = simulate(workload, replace(config, fast_path=False))
    assert_identical(fast, step)
