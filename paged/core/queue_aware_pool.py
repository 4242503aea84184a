"""A block pool that evicts the free cached blocks the waiting queue will hit last, and those it
needs soonest after all others (`CacheConfig.eviction="queue"`).

The default pool (`BlockPool`, vLLM's order) evicts the least recently freed block first. Past
saturation that is the wrong block: a finished turn's history is freed while its conversation's
next turn waits in the queue, and by the time the queue reaches that turn (tens of seconds under
FCFS) the admissions ahead of it have evicted it. Here the scheduler tells the pool which hashes
each waiting request's prompt holds and where the request stands in the queue (`want`, `unwant`);
a free cached block that some waiting request holds is kept apart from the others and evicted only
when no other cached block is free, the one whose nearest holder stands furthest back first, and
of one holder's blocks the tail first (a prefix hit stops at the first missing block). Under a
static queue order that is the order of next use. vLLM's RFC #48485 ("waiting-queue-informed LRU")
proposes the same order; neither vLLM nor SGLang (LRU or LFU over its radix tree) ships it.

A block's rank is (its nearest holder's queue key, the block's index in that holder's prompt); the
kept blocks sit in a heap on their negated rank, with stale entries (the block was hit or evicted,
or its nearest holder changed) dropped as they come up and cleared once they outnumber the live.
"""
from __future__ import annotations

import heapq
from bisect import insort

from .block_pool import Block, BlockPool


def _negated(rank: tuple) -> tuple:
    return tuple(-x for x in rank)


class QueueAwarePool(BlockPool):
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        super().__init__(num_blocks, enable_caching)
        self._holders: dict[object, list[tuple]] = {}  # hash -> ranks of the waiting prompts holding it, nearest first
        self._kept: dict[int, Block] = {}  # free cached blocks some waiting request holds
        self._heap: list[tuple] = []  # (negated rank, rank, block id): the kept block needed last on top

    @property
    def num_kept(self) -> int:
        """Free cached blocks that a waiting request holds (`CacheConfig.queue_reserve` keeps them)."""
        return len(self._kept)

    def want(self, block_hashes, key: tuple) -> None:
        """A request of queue key `key` waits with a prompt whose blocks hash to `block_hashes`."""
        holders, cached, lru, kept = self._holders, self.cached, self._lru, self._kept
        for i, h in enumerate(block_hashes):
            rank = (*key, i)
            ranks = holders.get(h)
            if ranks is None:
                holders[h] = [rank]
            else:
                insort(ranks, rank)
                if ranks[0] is not rank:
                    continue  # a nearer request holds it: its rank stands
            b = cached.get(h)
            if b is not None and b.ref_cnt == 0:
                if ranks is None:
                    del lru[b.block_id]
                    kept[b.block_id] = b
                self._push(rank, b)

    def unwant(self, block_hashes, key: tuple) -> None:
        """The request `want` was told of left the queue (admitted or aborted)."""
        holders, cached, lru, kept = self._holders, self.cached, self._lru, self._kept
        for i, h in enumerate(block_hashes):
            ranks = holders[h]
            rank = (*key, i)
            nearest = ranks[0] == rank
            if nearest:
                del ranks[0]
            else:
                ranks.remove(rank)
            b = cached.get(h)
            if not ranks:
                del holders[h]
                if b is not None and b.block_id in kept:
                    # nobody waits for it any more (a block past where its holder's hit stopped): evict it first
                    del kept[b.block_id]
                    lru[b.block_id] = b
                    lru.move_to_end(b.block_id, last=False)
            elif nearest and b is not None and b.block_id in kept:
                self._push(ranks[0], b)

    def _push(self, rank: tuple, b: Block) -> None:
        heap = self._heap
        if len(heap) > 2 * len(self._kept) + 64:  # mostly stale: rebuild from the live entries
            holders = self._holders
            heap[:] = []
            for bid, k in self._kept.items():
                r = holders[k.block_hash][0]
                heap.append((_negated(r), r, bid))
            heapq.heapify(heap)
        heapq.heappush(heap, (_negated(rank), rank, b.block_id))

    def touch(self, blocks) -> None:
        kept = self._kept
        if kept:
            blocks = list(blocks)
            for b in blocks:  # a hit on a kept block: back among the free ones, which touch takes it from
                if b.ref_cnt == 0 and b.block_id in kept:
                    del kept[b.block_id]
                    self._lru[b.block_id] = b
        super().touch(blocks)

    def free(self, blocks) -> None:
        blocks = list(blocks)
        try:
            super().free(blocks)
        finally:  # (a double free refused midway leaves the blocks before it freed)
            holders = self._holders
            if holders:
                lru, kept = self._lru, self._kept
                for b in blocks:
                    if b.ref_cnt == 0 and b.block_hash in holders and b.block_id in lru:
                        del lru[b.block_id]
                        kept[b.block_id] = b
                        self._push(holders[b.block_hash][0], b)

    def _evict(self, n: int) -> list[Block]:
        """The unheld cached blocks in LRU order, then as many kept ones as are short, needed last first."""
        lru = self._lru
        short = n - len(lru)
        if short > 0:
            heap, kept, holders = self._heap, self._kept, self._holders
            while short:
                _, rank, bid = heapq.heappop(heap)
                b = kept.get(bid)
                if b is None or holders[b.block_hash][0] is not rank:
                    continue  # stale
                del kept[bid]
                lru[bid] = b  # the base class evicts it from there, after the unheld ones
                short -= 1
        return super()._evict(n)

    def free_block_ids(self) -> set[int]:
        return super().free_block_ids() | set(self._kept)

    def reset_prefix_cache(self) -> None:
        self._lru.update(self._kept)
        self._kept.clear()
        self._heap.clear()
        super().reset_prefix_cache()
