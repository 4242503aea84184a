"""The pool of KV blocks: reference counts, the free blocks, and the prefix-cache map.

A freed block keeps its content and its hash until it is handed out again, so a later request
with the same prefix can take it back (a prefix-cache hit) for free. Free blocks live in two
places: blocks that hold nothing reusable (no hash) on a plain stack, handed out first and in
bulk; cached blocks in an `OrderedDict` in least-recently-freed order, from which a hit takes a
block out of the middle in O(1) and eviction pops the front. Neither allocates per call.

Callers free a request's blocks tail first, so the end of a prefix is evicted before its
start and the shared start survives longest.

Blocks lent by count (`lend`): a request whose blocks nobody can ever share or cache (a
length-only trace row, one sequence) needs no particular blocks, only as many as it holds.
The pool lends it plain blocks as a number: `num_lent` of the blocks on the plain stack are
taken, which ones unsaid, so a lending costs O(1) whatever its size. Plain blocks are
interchangeable (no hash, no holder), so this hands out, evicts and frees exactly as lending
particular blocks would; `materialize` turns lent blocks into particular ones when a driver
needs their ids.

KV events (opt-in): a pool given an `events` sink tells it which hashes became cached and which
were evicted, as vLLM's KV events (BlockStored / BlockRemoved / AllBlocksCleared) tell llm-d's
router. Without a sink (the default) the pool pays one attribute test per call.
"""
from __future__ import annotations

import random
from collections import OrderedDict
from typing import Protocol


class KVEvents(Protocol):
    """Where a pool reports changes to the set of hashes it caches (`BlockPool.cached`)."""

    def blocks_stored(self, block_hashes: list) -> None: ...

    def blocks_removed(self, block_hashes: list) -> None: ...

    def all_blocks_cleared(self) -> None: ...


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
        self._plain: list[Block] = self.blocks[::-1]  # free, no hash: popped from the end (block 0 first)
        self._lru: OrderedDict[int, Block] = OrderedDict()  # free, cached: the front is evicted first
        self.cached: dict[object, Block] = {}
        self.num_lent = 0  # blocks of the plain stack lent by count: not free
        # len(_plain) - num_lent + len(_lru), kept by every method that moves a block on or off the
        # free lists: the scheduler reads it ~90k times a run, a property call's cost each time.
        self.num_free_blocks = num_blocks
        self.num_evictions = 0
        # Blocks taken off the free lists (handed out, or revived by a cache hit); every one taken
        # is either in use now or was given back, so the frees need no counter of their own.
        self.num_allocations = 0
        self.events: KVEvents | None = None

    @property
    def num_frees(self) -> int:
        """Blocks given back to the free lists, ever."""
        return self.num_allocations - self.num_used_blocks

    @property
    def num_plain_free_blocks(self) -> int:
        """Free blocks that hold nothing reusable: handed out before any cached block is evicted."""
        return len(self._plain) - self.num_lent

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def free_block_ids(self) -> set[int]:
        """Ids of the blocks no particular holder holds (with blocks lent by count, more than are free)."""
        return {b.block_id for b in self._plain} | set(self._lru)

    def shuffle_free_blocks(self, rng: random.Random) -> None:
        """Hand the plain free blocks out in a random order from now on. A fresh pool hands out
        block 0, 1, 2, ... so each request's blocks lie side by side; after minutes of serving,
        blocks come back in the order requests finish and a request's table is scattered over the
        cache. The engine's profiler times the scattered layout a serving engine reads."""
        rng.shuffle(self._plain)

    def get_cached(self, block_hash) -> Block | None:
        return self.cached.get(block_hash)

    def touch(self, blocks) -> None:
        """Take references on cache hits; a hit on a free block takes it off the free list."""
        lru = self._lru
        for b in blocks:
            if b.ref_cnt == 0:
                del lru[b.block_id]
                self.num_allocations += 1
                self.num_free_blocks -= 1
            b.ref_cnt += 1

    def allocate(self) -> Block | None:
        """Hand out one block, evicting its old hash; None when none is free (one call, not a
        check and a call: the decode hot path asks this once per block boundary)."""
        plain = self._plain
        if len(plain) > self.num_lent:
            b = plain.pop()
            b.ref_cnt = 1
            self.num_allocations += 1
            self.num_free_blocks -= 1
            return b
        return self._evict(1)[0] if self.num_free_blocks else None  # (all the free blocks are cached ones)

    def allocate_n(self, n: int) -> list[Block]:
        k = self._num_plain_for(n, "allocate_n")
        blocks = self._pop_plain(k)
        if k < n:
            blocks += self._evict(n - k)
        return blocks

    def _num_plain_for(self, n: int, caller: str) -> int:
        """How many of n blocks come off the plain stack (the rest are evicted); raises if fewer than n are free."""
        plain = len(self._plain) - self.num_lent
        if n > self.num_free_blocks:
            raise RuntimeError(f"{caller}({n}) with only {self.num_free_blocks} free blocks")
        return n if n < plain else plain

    def lend(self, n: int) -> None:
        """Lend n blocks by count (see the module's docstring), evicting as `allocate_n` would."""
        k = self._num_plain_for(n, "lend")
        if k < n:  # evicted blocks lose their hash: plain blocks, lent like the others
            evicted = self._evict(n - k)
            for b in evicted:
                b.ref_cnt = 0
            self._plain.extend(evicted)
        self.num_lent += n
        self.num_allocations += k
        self.num_free_blocks -= k  # _evict counted the rest

    def lend_plain(self, n: int) -> bool:
        """`lend` if the plain stack covers n (no eviction); else False, changing nothing."""
        if n > len(self._plain) - self.num_lent:
            return False
        self.num_lent += n
        self.num_allocations += n
        self.num_free_blocks -= n
        return True

    def give_back(self, n: int) -> None:
        """Return n blocks lent by count."""
        if n > self.num_lent:
            raise RuntimeError(f"give_back({n}) with only {self.num_lent} blocks lent")
        self.num_lent -= n
        self.num_free_blocks += n

    def materialize(self, n: int) -> list[Block]:
        """n blocks lent by count as particular blocks, each with one reference, for a holder
        whose ids a driver needs: still lent to the same holder, now by name."""
        if n > self.num_lent:
            raise RuntimeError(f"materialize({n}) with only {self.num_lent} blocks lent")
        self.num_lent -= n
        self.num_allocations -= n  # _pop_plain counts them again
        self.num_free_blocks += n  # and takes them off the free count again
        return self._pop_plain(n)

    def _pop_plain(self, k: int) -> list[Block]:
        plain = self._plain
        start = len(plain) - k
        blocks = plain[start:]
        blocks.reverse()  # in the order single pops would give
        del plain[start:]
        for b in blocks:
            b.ref_cnt = 1
        self.num_allocations += k
        self.num_free_blocks -= k
        return blocks

    def _evict(self, n: int) -> list[Block]:
        """The n least recently freed cached blocks, their hashes forgotten, handed out.
        One loop for all n: a long prompt on a warm cache evicts thousands at once."""
        lru, cached = self._lru, self.cached
        removed = [] if self.events is not None else None
        out = []
        for _ in range(n):
            _, b = lru.popitem(last=False)
            del cached[b.block_hash]  # a block holds a hash only while the cache maps it to the block
            if removed is not None:
                removed.append(b.block_hash)
            b.block_hash = None
            b.ref_cnt = 1
            out.append(b)
        self.num_evictions += n
        self.num_allocations += n
        self.num_free_blocks -= n
        if removed is not None:
            self.events.blocks_removed(removed)
        return out

    def free(self, blocks) -> None:
        """Drop one reference from each block, in the order given (callers pass tail first)."""
        plain, lru = self._plain, self._lru
        freed = 0
        for b in blocks:
            if b.ref_cnt <= 0:
                self.num_free_blocks += freed  # the blocks freed before the refused one stay freed
                raise RuntimeError(f"double free of block {b.block_id}")
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                freed += 1
                if b.block_hash is None:
                    plain.append(b)
                else:
                    lru[b.block_id] = b
        self.num_free_blocks += freed

    def cache(self, blocks, block_hashes) -> None:
        """Register full blocks under their hashes (pairwise); the first block to claim a hash
        keeps it."""
        if not self.enable_caching:
            return
        cached = self.cached
        stored = [] if self.events is not None else None
        for b, h in zip(blocks, block_hashes):
            if b.block_hash is None and h not in cached:
                b.block_hash = h
                cached[h] = b
                if stored is not None:
                    stored.append(h)
        if stored:
            self.events.blocks_stored(stored)

    def reset_prefix_cache(self) -> None:
        """Forget every hash; free cached blocks become plain free blocks."""
        for b in self.cached.values():
            b.block_hash = None
        self.cached.clear()
        self._plain.extend(self._lru.values())
        self._lru.clear()
        if self.events is not None:
            self.events.all_blocks_cleared()
