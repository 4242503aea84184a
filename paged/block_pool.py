"""The pool of KV blocks: reference counts, an LRU free queue, and the prefix-cache map.

A freed block keeps its content and its hash until it is handed out again, so a later request
with the same prefix can take it back (a prefix-cache hit) for free. The free queue is an
`OrderedDict`, C-implemented: popping the least recently freed block, appending, and taking a
cached block out of the middle are all O(1) without allocating per call.

Eviction order: blocks that hold nothing reusable (no hash) are handed out first; cached
blocks in least-recently-freed order after them. Callers free a request's blocks tail first,
so the end of a prefix is evicted before its start and the shared start survives longest.
"""
from __future__ import annotations

from collections import OrderedDict


class Block:
    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref_cnt={self.ref_cnt}, cached={self.block_hash is not None})"


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"BlockPool num_blocks={num_blocks}: expected >= 1")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: dict[object, Block] = {}
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def get_cached(self, block_hash) -> Block | None:
        return self.cached.get(block_hash)

    def touch(self, blocks) -> None:
        """Take references on cache hits; a hit on a free block takes it off the free queue."""
        free = self._free
        for b in blocks:
            if b.ref_cnt == 0:
                del free[b.block_id]
            b.ref_cnt += 1

    def allocate(self) -> Block:
        """Hand out one block (the caller checked `num_free_blocks`), evicting its old hash."""
        _, b = self._free.popitem(last=False)
        h = b.block_hash
        if h is not None:
            if self.cached.get(h) is b:
                del self.cached[h]
            b.block_hash = None
            self.num_evictions += 1
        b.ref_cnt = 1
        return b

    def allocate_n(self, n: int) -> list[Block]:
        if n > len(self._free):
            raise RuntimeError(f"allocate_n({n}) with only {len(self._free)} free blocks")
        return [self.allocate() for _ in range(n)]

    def free(self, blocks) -> None:
        """Drop one reference from each block, in the order given (callers pass tail first)."""
        free = self._free
        for b in blocks:
            if b.ref_cnt <= 0:
                raise RuntimeError(f"double free of block {b.block_id}")
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                free[b.block_id] = b
                if b.block_hash is None:
                    free.move_to_end(b.block_id, last=False)

    def cache(self, block: Block, block_hash) -> None:
        """Register a full block under its hash; the first block to claim a hash keeps it."""
        if self.enable_caching and block.block_hash is None and block_hash not in self.cached:
            block.block_hash = block_hash
            self.cached[block_hash] = block

    def reset_prefix_cache(self) -> None:
        """Forget every hash; free blocks become plain free blocks."""
        for b in self.cached.values():
            b.block_hash = None
        self.cached.clear()
