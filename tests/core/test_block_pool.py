"""BlockPool invariants under random operations (hypothesis stateful test), blocks lent by
count (a length-only request's) among particular ones."""
import random

import hypothesis.strategies as st
import pytest
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from paged.core.block_pool import BlockPool

NUM_BLOCKS = 12


class BlockPoolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.pool = BlockPool(NUM_BLOCKS)
        self.holders: list[list] = []  # each holder owns one reference to each of its blocks
        self.lent: list[int] = []  # holders of blocks lent by count: how many each holds
        self.taken = self.given_back = 0  # blocks taken off the free lists / given back to them

    @rule(n=st.integers(1, 4), by_count=st.booleans())
    def allocate(self, n, by_count):
        """n named blocks (`allocate_n`), or n lent by count (`lend`, a length-only request's)."""
        take = self.pool.lend if by_count else self.pool.allocate_n
        if n > self.pool.num_free_blocks:
            with pytest.raises(RuntimeError):
                take(n)
            return
        blocks = take(n)
        if by_count:
            self.lent.append(n)
        else:
            assert all(b.ref_cnt == 1 and b.block_hash is None for b in blocks)
            self.holders.append(blocks)
        self.taken += n

    @rule()
    def allocate_one(self):
        """The decode path's single block: None when none is free."""
        free = self.pool.num_free_blocks
        b = self.pool.allocate()
        assert (b is None) == (free == 0)
        if b is not None:
            assert b.ref_cnt == 1 and b.block_hash is None
            self.holders.append([b])
            self.taken += 1

    @rule(n=st.integers(1, 4))
    def lend_plain(self, n):
        plain = self.pool.num_plain_free_blocks
        assert self.pool.lend_plain(n) == (n <= plain)
        if n <= plain:
            self.lent.append(n)
            self.taken += n

    @precondition(lambda self: self.lent)
    @rule(i=st.integers(0, 100))
    def give_back(self, i):
        n = self.lent.pop(i % len(self.lent))
        self.pool.give_back(n)
        self.given_back += n

    @precondition(lambda self: self.lent)
    @rule(i=st.integers(0, 100))
    def materialize(self, i):
        """A holder by count gets particular blocks: plain ones, its alone."""
        blocks = self.pool.materialize(self.lent.pop(i % len(self.lent)))
        assert all(b.ref_cnt == 1 and b.block_hash is None for b in blocks)
        self.holders.append(blocks)

    @rule(seed=st.integers(0, 1 << 16))
    def shuffle(self, seed):
        free = self.pool.free_block_ids()
        self.pool.shuffle_free_blocks(random.Random(seed))
        assert self.pool.free_block_ids() == free

    @precondition(lambda self: self.holders)
    @rule(i=st.integers(0, 100))
    def free(self, i):
        blocks = self.holders.pop(i % len(self.holders))
        self.given_back += sum(b.ref_cnt == 1 for b in blocks)
        self.pool.free(reversed(blocks))

    @precondition(lambda self: self.holders)
    @rule(i=st.integers(0, 100), h=st.integers(0, 5))
    def cache(self, i, h):
        blocks = self.holders[i % len(self.holders)]
        self.pool.cache(blocks[:1], [("h", h)])

    @rule(h=st.integers(0, 5))
    def hit(self, h):
        b = self.pool.get_cached(("h", h))
        if b is not None:
            assert b.block_hash == ("h", h)
            self.taken += b.ref_cnt == 0
            self.pool.touch([b])
            self.holders.append([b])

    @precondition(lambda self: any(b.ref_cnt == 0 for b in self.pool.blocks))
    @rule(with_holder=st.booleans())
    def double_free_is_refused(self, with_holder):
        """Refused at the free block; a holder's blocks listed before it are freed all the same."""
        b = next(b for b in self.pool.blocks if b.ref_cnt == 0)
        before = self.holders.pop() if with_holder and self.holders else []
        self.given_back += sum(x.ref_cnt == 1 for x in before)
        with pytest.raises(RuntimeError, match="double free"):
            self.pool.free([*reversed(before), b])

    @invariant()
    def ref_counts_equal_holders(self):
        counts = [0] * NUM_BLOCKS
        for blocks in self.holders:
            for b in blocks:
                counts[b.block_id] += 1
        assert [b.ref_cnt for b in self.pool.blocks] == counts
        assert self.pool.num_lent == sum(self.lent)
        assert self.pool.num_free_blocks == counts.count(0) - sum(self.lent) >= 0
        # the free count is a counter kept by hand: it must match the free lists it counts
        assert self.pool.num_free_blocks == len(self.pool.free_block_ids()) - self.pool.num_lent
        assert self.pool.free_block_ids() == {i for i, c in enumerate(counts) if c == 0}
        assert self.pool.num_plain_free_blocks == self.pool.num_free_blocks - sum(
            b.ref_cnt == 0 and b.block_hash is not None for b in self.pool.blocks)

    @invariant()
    def allocations_and_frees_are_counted(self):
        assert (self.pool.num_allocations, self.pool.num_frees) == (self.taken, self.given_back)

    @invariant()
    def cache_map_is_consistent(self):
        """Both ways: the map names blocks by their hash, and a block holds a hash only while
        the map names it by that hash (eviction relies on it)."""
        for h, b in self.pool.cached.items():
            assert b.block_hash == h
        for b in self.pool.blocks:
            assert b.block_hash is None or self.pool.cached[b.block_hash] is b

    @rule()
    def reset_prefix_cache(self):
        self.pool.reset_prefix_cache()
        assert not self.pool.cached and all(b.block_hash is None for b in self.pool.blocks)

    def teardown(self):
        for blocks in self.holders:
            self.pool.free(reversed(blocks))
        self.pool.give_back(sum(self.lent))
        self.pool.reset_prefix_cache()
        assert self.pool.num_free_blocks == NUM_BLOCKS and not self.pool.cached


TestBlockPool = BlockPoolMachine.TestCase


def test_free_queue_evicts_uncached_first_then_lru_tail_first():
    pool = BlockPool(6)
    a = pool.allocate_n(3)  # a request's prefix: blocks 0, 1, 2
    for i, b in enumerate(a):
        pool.cache([b], [i])
    plain = pool.allocate_n(1)
    pool.free(reversed(a))  # tail first
    pool.free(plain)
    order = [pool.allocate().block_id for _ in range(6)]
    # never-used blocks and the plain one go before cached ones; among cached, the tail first
    assert order[-3:] == [2, 1, 0]
    assert set(order[:3]) == {3, 4, 5}
    assert pool.num_evictions == 3 and not pool.cached


def test_hit_on_free_cached_block_takes_it_off_the_free_queue():
    pool = BlockPool(2)
    (b,) = pool.allocate_n(1)
    pool.cache([b], ["x"])
    pool.free([b])
    assert pool.num_free_blocks == 2
    hit = pool.get_cached("x")
    pool.touch([hit])
    assert hit is b and b.ref_cnt == 1 and pool.num_free_blocks == 1


def test_shuffled_free_blocks_are_handed_out_in_a_seeded_random_order():
    """A fresh pool hands out blocks 0, 1, 2, ...; shuffled, a permutation of them, the same for the same seed."""
    def order(seed):
        pool = BlockPool(64)
        pool.shuffle_free_blocks(random.Random(seed))
        return [b.block_id for b in pool.allocate_n(40)] + [pool.allocate().block_id for _ in range(24)]

    assert order(1) == order(1) != order(2)
    assert sorted(order(1)) == list(range(64)) and order(1)[:40] != list(range(40))


def test_lending_by_count_takes_plain_blocks_then_evicts_the_lru_front():
    pool = BlockPool(4)
    a = pool.allocate_n(2)
    pool.cache(a, ["x", "y"])
    pool.free(reversed(a))  # "y" is evicted first
    pool.lend(3)  # the two never-used blocks, then one eviction
    assert pool.num_evictions == 1 and set(pool.cached) == {"x"} and pool.num_free_blocks == 1
    assert not pool.lend_plain(1)  # only a cached block is free
    pool.give_back(3)
    assert pool.num_free_blocks == 4 and pool.num_plain_free_blocks == 3
    with pytest.raises(RuntimeError, match="give_back"):
        pool.give_back(1)
