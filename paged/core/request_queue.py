"""The queue of requests waiting to be admitted (or swapped in), in the policy's order.

With a static-order policy it is a heap of (*key, arrival counter, request), the key spread out
(one tuple comparison per step down the heap, not two; a policy's keys all have one length): the
counter breaks ties, so a policy's keys may tie. A request that leaves early (abort) is skipped lazily. With a
dynamic policy (longest prefix match) the order is computed once per scheduling step, when the
head is first asked for: the cache changes between steps, not while one step admits.

`KVTellingQueue`, the waiting queue over a queue-aware pool (`CacheConfig.eviction="queue"`), tells
the KV cache manager each request that joins or leaves it, with its key.
"""
from __future__ import annotations

import heapq
import itertools

from .policies import Policy
from .request import Request, RequestStatus


class RequestQueue:
    tells_kv = False  # whether it tells the KV cache manager who waits where (`KVTellingQueue`)

    def __init__(self, policy: Policy, status: RequestStatus, kv=None) -> None:
        self.policy = policy
        self.status = status  # the status a live member has (WAITING or SWAPPED)
        self.kv = kv
        self._heap: list[tuple] = []
        self._counter = itertools.count()
        self._items: list[Request] = []  # dynamic order: the head last
        self._stale = False
        # Live members: a plain attribute that the scheduler's hot paths read (a truth test through
        # __bool__ is a Python call, tens of thousands of times a run).
        self.num_requests = 0

    def __len__(self) -> int:
        return self.num_requests

    def __bool__(self) -> bool:
        return self.num_requests > 0

    def push(self, req: Request) -> None:
        req.status = self.status
        self.num_requests += 1
        if self.policy.static_order:
            heapq.heappush(self._heap, (*self.policy.key(req), next(self._counter), req))
        else:
            self._items.append(req)
            self._stale = True

    def step_begins(self) -> None:
        """A new scheduling step: a dynamic order is recomputed when next asked for."""
        self._stale = True

    def peek(self) -> Request | None:
        if self.policy.static_order:
            heap = self._heap
            while heap and heap[0][-1].status != self.status:
                heapq.heappop(heap)
            return heap[0][-1] if heap else None
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
        self.num_requests -= 1
        if self.policy.static_order:
            return heapq.heappop(self._heap)[-1]
        return self._items.pop()

    def discard(self, req: Request) -> None:
        """Forget a member that leaves other than by the head (its status changes, so it is skipped).
        In a heap, skipped members behind a head that cannot be admitted would stay as long as it
        waits: they are dropped for good once they outnumber the live ones. (A dynamic order drops
        them every step.)"""
        self.num_requests -= 1
        heap = self._heap
        if len(heap) > 2 * self.num_requests:
            heap[:] = [e for e in heap if e[-1].status == self.status and e[-1] is not req]
            heapq.heapify(heap)

    def __iter__(self):
        src = (e[-1] for e in self._heap) if self.policy.static_order else iter(self._items)
        return (r for r in src if r.status == self.status)


class KVTellingQueue(RequestQueue):
    """A queue in a static order that tells the KV cache manager who waits where (`KVCacheManager.waits`)."""

    tells_kv = True

    def __init__(self, policy: Policy, status: RequestStatus, kv) -> None:
        if not policy.static_order:
            raise ValueError(f"policy {policy.name!r}: a queue-aware KV cache needs a static queue order "
                             "(its members' keys must not change while they wait)")
        super().__init__(policy, status, kv)

    def push(self, req: Request) -> None:
        super().push(req)
        self.kv.waits(req, self.policy.key(req))

    def pop(self) -> Request:
        req = super().pop()
        self.kv.stops_waiting(req, self.policy.key(req))
        return req

    def discard(self, req: Request) -> None:
        super().discard(req)
        self.kv.stops_waiting(req, self.policy.key(req))
