"""KVCacheManager invariants under random operations (hypothesis stateful test).

The test plays the driver: it keeps the content of every physical block (which token sits in
which slot), writes tokens where the slot mapping says, performs the copies and swaps the
manager asks for, and checks after each step that reference counts equal holders, that a
prefix-cache hit returns blocks holding exactly the request's tokens, and that nothing is
ever written into a block another request also holds. Length-only requests (no tokens) hold
their blocks by count among them, until a driver names them (`block_table`, a swap-out).
"""
import hypothesis.strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from paged import CacheConfig, KVCacheManager, Request
from paged.core.block_table import BlockCount, BlockTable

BS = 4
NUM_BLOCKS = 16
NUM_CPU_BLOCKS = 8
# a small vocabulary and shared starts make prefix hits common
PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [5, 5, 5, 5]]


class KVMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.kv = KVCacheManager(CacheConfig(num_gpu_blocks=NUM_BLOCKS, block_size=BS, num_cpu_blocks=NUM_CPU_BLOCKS))
        self.content = {}  # gpu block id -> {offset: token}
        self.cpu_content = {}
        self.active: dict[str, Request] = {}  # requests holding device blocks
        self.swapped: dict[str, Request] = {}
        self.n = 0

    def _write(self, req, start, end):
        if not req.has_content:  # a length-only request: no tokens to write, its blocks stay unnamed
            return
        tokens = req.all_token_ids()
        table = self.kv.block_table(req)
        for pos in range(start, end):
            block_id, off = table.lookup(pos)
            assert self.kv.pool.blocks[block_id].ref_cnt == 1, "write into a shared block (no copy-on-write)"
            self.content.setdefault(block_id, {})[off] = tokens[pos]

    def _apply_copies(self):
        for src, dst in self.kv.end_step():
            self.content[dst] = dict(self.content.get(src, {}))

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(0, 9), max_size=9), chunk=st.integers(1, 12))
    def admit(self, prefix, tail, chunk):
        req = Request(f"r{self.n}", prefix + tail, max_tokens=4)
        self.n += 1
        hits, num_hit = self.kv.get_computed_blocks(req)
        assert num_hit % BS == 0 and num_hit < req.num_tokens
        tokens = req.all_token_ids()
        for i, b in enumerate(hits):  # a hit never returns a block with other contents
            assert self.content[b.block_id] == {o: tokens[i * BS + o] for o in range(BS)}
        n = min(chunk, req.num_tokens - num_hit)
        if not self.kv.allocate_slots(req, n, hits):
            assert req.request_id not in self.kv.tables
            return
        req.num_computed_base = num_hit
        self._apply_copies()
        self._write(req, num_hit, num_hit + n)
        req.num_computed_base += n
        self.kv.cache_full_blocks(req, req.num_computed_base)
        self.active[req.request_id] = req

    @rule(num_tokens=st.integers(1, 20), chunk=st.integers(1, 12))
    def admit_length_only(self, num_tokens, chunk):
        req = Request(f"r{self.n}", num_prompt_tokens=num_tokens, max_tokens=4)
        self.n += 1
        assert self.kv.get_computed_blocks(req) == ([], 0)
        n = min(chunk, num_tokens)
        if not self.kv.allocate_slots(req, n):
            assert req.request_id not in self.kv.tables
            return
        assert isinstance(self.kv.tables[req.request_id], BlockCount)
        req.num_computed_base = n
        self.active[req.request_id] = req

    @precondition(lambda self: any(isinstance(self.kv.tables[r], BlockCount) for r in self.active))
    @rule(i=st.integers(0, 99))
    def name_blocks(self, i):
        """A driver asks for a length-only request's ids: particular blocks, its alone."""
        counted = [r for r in self.active.values() if isinstance(self.kv.tables[r.request_id], BlockCount)]
        req = counted[i % len(counted)]
        n = len(self.kv.tables[req.request_id])
        ids = self.kv.block_table(req).block_ids
        assert len(set(ids)) == n and all(self.kv.pool.blocks[b].ref_cnt == 1 for b in ids)

    @precondition(lambda self: self.active)
    @rule(i=st.integers(0, 99), chunk=st.integers(1, 6), tok=st.integers(0, 9))
    def step(self, i, chunk, tok):
        """Compute a chunk of a request; once its prompt is done, sample a token and decode."""
        req = list(self.active.values())[i % len(self.active)]
        c = req.num_computed_base
        if c == req.num_tokens:
            req.output_token_ids.append(tok)
            req.num_output_base += 1
        n = min(chunk, req.num_tokens - c)
        if not self.kv.allocate_slots(req, n):
            return
        self._apply_copies()
        self._write(req, c, c + n)
        req.num_computed_base += n
        self.kv.cache_full_blocks(req, req.num_computed_base)

    @precondition(lambda self: any(r.has_content for r in self.active.values()))
    @rule(i=st.integers(0, 99))
    def fork(self, i):
        parents = [r for r in self.active.values() if r.has_content]
        parent = parents[i % len(parents)]
        child = Request(f"r{self.n}", parent.prompt_token_ids, max_tokens=4)
        self.n += 1
        child.output_token_ids = list(parent.output_token_ids)
        child.num_output_base = parent.num_output_base
        child.num_computed_base = parent.num_computed_base
        self.kv.fork(parent, child)
        self.active[child.request_id] = child

    @precondition(lambda self: self.active)
    @rule(i=st.integers(0, 99))
    def free(self, i):
        req = self.active.pop(list(self.active)[i % len(self.active)])
        self.kv.free(req)

    @precondition(lambda self: self.active)
    @rule(i=st.integers(0, 99))
    def swap_out(self, i):
        req = list(self.active.values())[i % len(self.active)]
        mapping = self.kv.swap_out(req)
        if mapping is None:
            return
        for g, c in mapping:
            self.cpu_content[c] = dict(self.content.get(g, {}))
        del self.active[req.request_id]
        self.swapped[req.request_id] = req

    @precondition(lambda self: self.swapped)
    @rule(i=st.integers(0, 99))
    def swap_in(self, i):
        req = list(self.swapped.values())[i % len(self.swapped)]
        mapping = self.kv.swap_in(req)
        if mapping is None:
            return
        for c, g in mapping:
            self.content[g] = dict(self.cpu_content[c])
        del self.swapped[req.request_id]
        self.active[req.request_id] = req
        self.kv.cache_full_blocks(req, req.num_computed_base)

    @invariant()
    def ref_counts_equal_holders(self):
        counts = [0] * NUM_BLOCKS
        for table in self.kv.tables.values():
            for b in table.blocks:
                counts[b.block_id] += 1
        assert [b.ref_cnt for b in self.kv.pool.blocks] == counts
        lent = sum(len(t) for t in self.kv.tables.values() if isinstance(t, BlockCount))
        assert self.kv.pool.num_lent == lent
        assert self.kv.num_free_blocks == counts.count(0) - lent
        assert self.kv.num_table_slots == sum(t.num_slots for t in self.kv.tables.values())
        assert self.kv.num_named_tables == sum(isinstance(t, BlockTable) for t in self.kv.tables.values())

    @invariant()
    def tables_cover_exactly_the_computed_tokens(self):
        for req in self.active.values():
            assert len(self.kv.tables[req.request_id]) == -(-req.num_computed_base // BS)

    @invariant()
    def cached_blocks_hold_their_tokens(self):
        """Whatever the cache maps a hash to holds the tokens of some request that made it."""
        for b in self.kv.pool.cached.values():
            assert len(self.content.get(b.block_id, {})) == BS

    def teardown(self):
        for req in list(self.active.values()) + list(self.swapped.values()):
            self.kv.free(req)
        self.kv.end_step()
        self.kv.reset_prefix_cache()
        assert self.kv.num_free_blocks == NUM_BLOCKS
        assert self.kv.cpu_pool.num_free_blocks == NUM_CPU_BLOCKS


TestKVCacheManager = KVMachine.TestCase


def test_hit_never_covers_the_last_prompt_token():
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=8, block_size=4))
    a = Request("a", list(range(8)), max_tokens=1)
    assert kv.allocate_slots(a, 8)
    a.num_computed_base = 8
    kv.cache_full_blocks(a, 8)
    b = Request("b", list(range(8)), max_tokens=1)
    hits, n = kv.get_computed_blocks(b)
    assert n == 4 and len(hits) == 1  # the second block holds the last token: recomputed


def test_allocate_slots_refuses_instead_of_overcommitting():
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=4, block_size=4))
    a = Request("a", list(range(12)), max_tokens=1)
    assert kv.allocate_slots(a, 12)
    b = Request("b", list(range(100, 108)), max_tokens=1)
    assert not kv.allocate_slots(b, 8)
    assert kv.num_free_blocks == 1 and "b" not in kv.tables
    assert not kv.allocate_slots(b, 4, reserve=1)  # the watermark keeps the last block
    assert kv.allocate_slots(b, 4)


def test_mooncake_hash_ids_give_hits_at_a_smaller_block_size():
    """One 512-token id covers 512/16 = 32 blocks; equal id prefixes share those blocks."""
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=200, block_size=16))
    a = Request("a", num_prompt_tokens=1100, max_tokens=1, prefix_hash_ids=[7, 8, 9])
    assert kv.allocate_slots(a, 1100)
    a.num_computed_base = 1100
    kv.cache_full_blocks(a, 1100)
    b = Request("b", num_prompt_tokens=1024 + 40, max_tokens=1, prefix_hash_ids=[7, 8, 10])
    _, hit = kv.get_computed_blocks(b)
    assert hit == 1024
    c = Request("c", num_prompt_tokens=600, max_tokens=1, prefix_hash_ids=[7, 11])
    assert kv.get_computed_blocks(c)[1] == 512
    d = Request("d", num_prompt_tokens=600, max_tokens=1)  # a length-only trace row: no content, no hits
    assert kv.get_computed_blocks(d)[1] == 0


def test_block_table_lookup_and_slot_mapping():
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=8, block_size=4))
    filler = Request("f", list(range(4)), max_tokens=1)
    kv.allocate_slots(filler, 4)
    a = Request("a", list(range(6)), max_tokens=1)
    kv.allocate_slots(a, 6)
    table = kv.block_table(a)
    b0, b1 = table.block_ids
    assert kv.lookup(a, 5) == (b1, 1)
    assert kv.slot_mapping(a, 2, 6) == [b0 * 4 + 2, b0 * 4 + 3, b1 * 4, b1 * 4 + 1]


def test_host_blocks_being_swapped_in_are_not_reused_within_the_step():
    """The driver swaps out before it swaps in: a host block read this step must stay untouched."""
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=4, block_size=4, num_cpu_blocks=1))
    a, b = Request("a", list(range(4)), max_tokens=1), Request("b", list(range(10, 14)), max_tokens=1)
    for r in (a, b):
        assert kv.allocate_slots(r, 4)
        r.num_computed_base = 4
    (_, host), = kv.swap_out(a)
    kv.end_step()
    assert kv.swap_in(a) == [(host, kv.block_table(a).block_ids[0])]
    assert kv.swap_out(b) is None  # the only host block is being read: no room until the step ends
    kv.end_step()
    assert kv.swap_out(b) is not None


def test_copy_on_write_source_stays_reserved_until_the_copy_is_taken():
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=4, block_size=4))
    a = Request("a", list(range(6)), max_tokens=4)
    assert kv.allocate_slots(a, 6)
    a.num_computed_base = 6
    child = Request("c", list(range(6)), max_tokens=4)
    child.num_computed_base = 6
    kv.fork(a, child)
    shared = kv.block_table(a).block_ids[1]
    assert kv.allocate_slots(child, 1)  # copies the half-full shared block
    kv.free(a)  # the source's last holder leaves in the same step
    assert shared not in kv.pool.free_block_ids()  # still to be read by the copy
    assert kv.end_step() == [(shared, kv.block_table(child).block_ids[1])]
    assert shared in kv.pool.free_block_ids()
