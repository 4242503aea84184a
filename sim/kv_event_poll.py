"""KV events as a polling router sees them: late, in batches.

`kv_aware` keeps a view of each replica's prefix cache from its KV events (blocks stored, blocks
removed, all cleared). Handed straight to the view, an event is seen the instant the replica's
pool emits it, as a router on a low-latency event stream would (llm-d's scorer reads vLLM's over
ZMQ). Our real router reads each backend's `GET /kv/events` every `--kv-events-interval-s`
(0.25 s by default, `paged.serve.kv_sync`): an event is seen at the first read after it, up to
that long later. Routing in that window is what the staleness costs: a follow-up turn sent
before its predecessor's blocks were reported, an evicted prefix still believed cached.

`PolledKVEvents` stands between a replica's pool and the router's view of it: it queues each
event with the time of the first read after it (reads at every multiple of the interval, all
replicas alike; a read sees what happened before it), and `deliver(now)` applies, in order,
those whose read has come. The cluster delivers before each routing, the only moment the router
looks at its views, so the view it routes by is exactly what a router reading at those instants
would hold; no clock process is needed, so the simulation ends when the last request does, as
without polling.
"""
from __future__ import annotations

from collections import deque

from paged.core.block_pool import KVEvents


class PolledKVEvents:
    """A `KVEvents` sink (a pool's `events`) that passes events on to `view` at the next read."""

    __slots__ = ("view", "interval_ticks", "now", "pending")

    def __init__(self, view: KVEvents, interval_ticks: int, now) -> None:
        if not (isinstance(interval_ticks, int) and interval_ticks >= 1):
            raise ValueError(f"PolledKVEvents: interval_ticks={interval_ticks!r}, expected an integer >= 1")
        self.view = view
        self.interval_ticks = interval_ticks
        self.now = now  # the simulation's clock (ticks), read when an event is emitted
        self.pending: deque[tuple[int, object, tuple]] = deque()  # (read tick, the view's method, its arguments)

    def _queue(self, method, *args) -> None:
        self.pending.append(((self.now() // self.interval_ticks + 1) * self.interval_ticks, method, args))

    def blocks_stored(self, block_hashes: list) -> None:
        self._queue(self.view.blocks_stored, block_hashes)

    def blocks_removed(self, block_hashes: list) -> None:
        self._queue(self.view.blocks_removed, block_hashes)

    def all_blocks_cleared(self) -> None:
        self._queue(self.view.all_blocks_cleared)

    def deliver(self, now: int) -> None:
        """Apply, in the order they happened, the events the reads up to `now` (inclusive) have seen."""
        pending = self.pending
        while pending and pending[0][0] <= now:
            _, method, args = pending.popleft()
            method(*args)
