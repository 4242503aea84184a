"""A replica's KV events for routers: `GET /kv/events?since=SEQ` and `GET /kv/blocks`.

`KVEventLog` is the engine block pool's `events` sink (`paged.core.block_pool.KVEvents`, as the
simulator's replicas feed `kv_aware` directly): each change to the set of cached block hashes
becomes one numbered event, `{"seq", "kind": "stored" | "removed" | "cleared", "hashes"}`, with
the hashes as hex strings of the engine's chained block hashes (`paged.core.hashing`), which a
router computes from a token-id prompt to find them. The log keeps the last `capacity` events
only (a server runs for months): a reader that asks for events it no longer holds, or for a seq
it never reached (a restarted server's), gets `reset: true` and no events, and resyncs from
`snapshot` (every cached hash, with the seq it is current to). `epoch` names this log, so a
reader also sees a restart whose seq has caught up with its own.

The pool calls the sink from the engine's step, in a worker thread; `since` and `snapshot` run
through `AsyncLLM.inspect`, between steps, so nothing changes while they read.
"""
from __future__ import annotations

import uuid
from collections import deque
from itertools import islice
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the log itself needs no torch
    from paged.engine import LLMEngine

DEFAULT_CAPACITY = 10_000


class KVEventLog:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"KVEventLog capacity={capacity}: expected >= 1")
        self.epoch = uuid.uuid4().hex
        self.seq = 0  # of the last event; 0 before the first
        # (seq, kind, hashes): the pool's own lists, kept as they are (this runs in the engine's
        # step), written out as hex only when read
        self.events: deque[tuple[int, str, list]] = deque(maxlen=capacity)

    def _append(self, kind: str, block_hashes) -> None:
        self.seq += 1
        self.events.append((self.seq, kind, block_hashes))

    def blocks_stored(self, block_hashes) -> None:
        self._append("stored", block_hashes)

    def blocks_removed(self, block_hashes) -> None:
        self._append("removed", block_hashes)

    def all_blocks_cleared(self) -> None:
        self._append("cleared", [])

    def since(self, seq: int) -> dict:
        """The events after `seq`; `reset` when the log cannot say what happened since then."""
        first = self.events[0][0] if self.events else self.seq + 1  # seqs are consecutive
        reset = seq > self.seq or seq < first - 1
        events = [] if reset else [{"seq": n, "kind": kind, "hashes": [h.hex() for h in hashes]}
                                   for n, kind, hashes in islice(self.events, seq - first + 1, None)]
        return {"epoch": self.epoch, "seq": self.seq, "reset": reset, "events": events}


def snapshot(log: KVEventLog, engine: LLMEngine) -> dict:
    """Every hash the pool caches, current to `seq` (run between steps)."""
    kv = engine.scheduler.kv
    return {"epoch": log.epoch, "seq": log.seq, "block_size": kv.block_size,
            "blocks": [h.hex() for h in kv.pool.cached]}
