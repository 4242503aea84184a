"""DecodeBatch: the running requests in steady decode, advanced together by one clock.

In steady decode every member computes one token and samples one token per step. Instead of
touching each member, the batch keeps a clock; a member stores its counters as of the clock
when it joined, and `Request.num_computed_tokens` adds the difference on read. A step then
costs O(1) plus the members that cross into a new block — found without looking at the
others, because members are bucketed by their position within their last block — plus those
that finish, found in a map keyed by the clock at which they reach their output limit.

The same structure tells the simulator how many steps can run with nothing changing, and
lets it take k of them at once with a result identical to k single steps.
"""
from __future__ import annotations

import heapq
from bisect import bisect_right
from itertools import accumulate

from .request import Request


class DecodeBatch:
    __slots__ = ("block_size", "clock", "members", "buckets", "_bucket_sizes", "finish_at", "_finish_clocks",
                 "context_sum")

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.clock = 0
        self.members: dict[Request, None] = {}  # join order
        # buckets[p]: members that need a new block before the step taken at a clock == p mod bs
        self.buckets: list[dict[Request, None]] = [{} for _ in range(block_size)]
        self._bucket_sizes = [0] * block_size
        self.finish_at: dict[int, list[Request]] = {}  # clock -> members that reach their output limit then
        # Heap over finish_at's keys; it may hold keys since emptied (members that stopped early),
        # but never more than twice the live keys: see _drop_stale_clocks.
        self._finish_clocks: list[int] = []
        self.context_sum = 0  # sum over members of the context they attend to in the next step

    def __len__(self) -> int:
        return len(self.members)

    def join(self, req: Request) -> None:
        c = req.num_computed_base
        clock = self.clock
        req.decode_batch = self
        req.batch_clock0 = clock
        self.members[req] = None
        p = (clock - c) % self.block_size
        self.buckets[p][req] = None
        self._bucket_sizes[p] += 1
        fin = clock + req.max_output_tokens - req.num_output_base
        req.finish_clock = fin
        lst = self.finish_at.get(fin)
        if lst is None:
            self.finish_at[fin] = [req]
            heapq.heappush(self._finish_clocks, fin)
        else:
            lst.append(req)
        self.context_sum += c + 1

    def leave(self, req: Request) -> None:
        """Take a member out and write its counters back as plain values."""
        c0 = req.num_computed_base
        d = self.clock - req.batch_clock0
        del self.members[req]
        p = (req.batch_clock0 - c0) % self.block_size
        del self.buckets[p][req]
        self._bucket_sizes[p] -= 1
        due = self.finish_at.get(req.finish_clock)
        if due is not None:  # (absent when it leaves because it finished)
            due.remove(req)
            if not due:
                del self.finish_at[req.finish_clock]
                self._drop_stale_clocks()
        req.num_computed_base = c0 + d
        req.num_output_base += d
        req.decode_batch = None
        req.finish_clock = -1
        self.context_sum -= c0 + d + 1

    def crossers(self) -> dict[Request, None]:
        """Members whose next token starts a new block."""
        return self.buckets[self.clock % self.block_size]

    def advance(self, k: int = 1) -> list[Request]:
        """Count k steps taken; return the members that reached their output limit with the
        last. (k > 1 only when no member finishes before the last: see steps_to_next_finish.)"""
        self.clock = clock = self.clock + k
        self.context_sum += k * len(self.members)
        due = self.finish_at.pop(clock, None)
        if due is None:
            return []
        self._drop_stale_clocks()
        return due

    def _drop_stale_clocks(self) -> None:
        """Rebuild the heap from the live keys once stale ones outnumber them. Only the simulator's
        fast path pops stale keys as it goes (steps_to_next_finish); without this, a driver that
        never calls it (the engine) would grow the heap by one key per request that stopped early,
        for as long as it serves."""
        heap = self._finish_clocks
        if len(heap) > 2 * len(self.finish_at):
            heap[:] = sorted(self.finish_at)  # a sorted list is a heap

    def steps_to_next_finish(self) -> int:
        heap, finish_at = self._finish_clocks, self.finish_at
        while heap and heap[0] not in finish_at:
            heapq.heappop(heap)
        return heap[0] - self.clock if heap else 1 << 62

    def block_needs(self, k: int) -> list[int]:
        """New blocks needed by each of the next k steps."""
        bs, sizes, clock = self.block_size, self._bucket_sizes, self.clock
        return [sizes[(clock + j) % bs] for j in range(k)]

    def steps_with_blocks(self, num_free_blocks: int, k_max: int) -> int:
        """The largest k <= k_max for which the next k steps need at most `num_free_blocks`."""
        n = len(self.members)
        if n == 0:
            return k_max
        bs, c = self.block_size, self.clock % self.block_size
        cycles = k_max // bs
        if num_free_blocks // n < cycles:  # each whole cycle of bs steps needs n blocks
            cycles = num_free_blocks // n
        k, free = cycles * bs, num_free_blocks - cycles * n
        if free >= n:  # a whole cycle more fits, and k_max - k < bs steps are left (the usual case)
            return k_max
        # Then the steps of the next cycle while their blocks fit: the number of its running totals
        # (never decreasing) within what is left.
        totals = list(accumulate(self._bucket_sizes[c:] + self._bucket_sizes[:c]))
        return k + min(bisect_right(totals, free), k_max - k)
