"""The queue of requests waiting to be admitted (or swapped in), in the policy's order.

With a static-order policy it is a heap; a request that leaves it early (abort) is skipped
lazily. With a dynamic policy (longest prefix match) it is re-sorted when the head is asked
for after a change of the cache.
"""
from __future__ import annotations

import heapq

from .policies import Policy
from .request import Request, RequestStatus


class RequestQueue:
    def __init__(self, policy: Policy, status: RequestStatus, kv=None) -> None:
        self.policy = policy
        self.status = status  # the status a live member has (WAITING or SWAPPED)
        self.kv = kv
        self._heap: list[tuple[tuple, Request]] = []
        self._items: list[Request] = []
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def push(self, req: Request) -> None:
        req.status = self.status
        self._len += 1
        if self.policy.static_order:
            heapq.heappush(self._heap, (self.policy.key(req), req))
        else:
            self._items.append(req)

    def peek(self) -> Request | None:
        if self.policy.static_order:
            heap = self._heap
            while heap and heap[0][1].status != self.status:
                heapq.heappop(heap)
            return heap[0][1] if heap else None
        items = self._items = [r for r in self._items if r.status == self.status]
        if not items:
            return None
        key, kv = self.policy.key, self.kv
        items.sort(key=lambda r: key(r, kv))
        return items[0]

    def pop(self) -> Request:
        """Remove the head returned by the last `peek`."""
        self._len -= 1
        if self.policy.static_order:
            return heapq.heappop(self._heap)[1]
        return self._items.pop(0)

    def discard(self, req: Request) -> None:
        """Forget a member that leaves other than by the head (its status changes, so it is skipped)."""
        self._len -= 1

    def __iter__(self):
        src = (r for _, r in self._heap) if self.policy.static_order else iter(self._items)
        return (r for r in src if r.status == self.status)
