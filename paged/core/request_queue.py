"""The queue of requests waiting to be admitted (or swapped in), in the policy's order.

With a static-order policy it is a heap of (key, arrival counter, request): the counter breaks
ties, so a policy's keys may tie. A request that leaves early (abort) is skipped lazily. With a
dynamic policy (longest prefix match) the order is computed once per scheduling step, when the
head is first asked for: the cache changes between steps, not while one step admits.

Lazy skipping alone would keep every aborted request behind a head that cannot be admitted
(20,001 entries for one live request in a probe); so when the dead entries outnumber the live
ones (and `COMPACT_SLACK`), they are dropped at once. Each compaction removes at least half the
entries, so it costs O(1) per discard, amortised, and the order of the live ones is kept.
"""
from __future__ import annotations

import heapq
import itertools

from .policies import Policy
from .request import Request, RequestStatus

COMPACT_SLACK = 64  # dead entries always tolerated: a small queue never compacts


class RequestQueue:
    def __init__(self, policy: Policy, status: RequestStatus, kv=None) -> None:
        self.policy = policy
        self.status = status  # the status a live member has (WAITING or SWAPPED)
        self.kv = kv
        self._heap: list[tuple[tuple, int, Request]] = []
        self._counter = itertools.count()
        self._items: list[Request] = []  # dynamic order: the head last
        self._stale = False
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def push(self, req: Request) -> None:
        req.status = self.status
        self._len += 1
        if self.policy.static_order:
            heapq.heappush(self._heap, (self.policy.key(req), next(self._counter), req))
        else:
            self._items.append(req)
            self._stale = True

    def step_begins(self) -> None:
        """A new scheduling step: a dynamic order is recomputed when next asked for."""
        self._stale = True

    def peek(self) -> Request | None:
        if self.policy.static_order:
            heap = self._heap
            while heap and heap[0][2].status != self.status:
                heapq.heappop(heap)
            return heap[0][2] if heap else None
        items = self._items
        if self._stale:
            live = [r for r in items if r.status == self.status]
            items[:] = self.policy.order(live, self.kv)[::-1]
            self._stale = False
        while items and items[-1].status != self.status:
            items.pop()
        return items[-1] if items else None

    def pop(self) -> Request:
        """Remove the head returned by the last `peek`."""
        self._len -= 1
        if self.policy.static_order:
            return heapq.heappop(self._heap)[2]
        return self._items.pop()

    @property
    def num_entries(self) -> int:
        """Entries held, live and dead: at most 2 x len(self) + COMPACT_SLACK."""
        return len(self._heap) + len(self._items)

    def discard(self, req: Request) -> None:
        """Forget a member that leaves other than by the head (its status changes, so it is
        skipped); drop every dead entry when they outnumber the live ones."""
        self._len -= 1
        if self.num_entries > 2 * self._len + COMPACT_SLACK:
            def live(r: Request) -> bool:  # `req` still has the status of a member
                return r is not req and r.status == self.status

            if self.policy.static_order:
                self._heap = [e for e in self._heap if live(e[2])]
                heapq.heapify(self._heap)
            else:
                self._items[:] = [r for r in self._items if live(r)]

    def __iter__(self):
        src = (r for _, _, r in self._heap) if self.policy.static_order else iter(self._items)
        return (r for r in src if r.status == self.status)
