"""The queue-aware pool (`CacheConfig.eviction="queue"`): BlockPool's invariants under random
operations with requests joining and leaving the waiting queue, its eviction order (no waiting
prompt's blocks first, then the one the queue needs last), and what it gives a conversation
under FCFS: the history of a finished turn survives until the next turn, waiting behind others,
is admitted."""
import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import invariant, precondition, rule

from paged import CacheConfig, Request, SamplingParams, SchedulerConfig
from paged.core.queue_aware_pool import QueueAwarePool
from paged.core.scheduler import Scheduler

from .test_block_pool import NUM_BLOCKS, BlockPoolMachine


class QueueAwarePoolMachine(BlockPoolMachine):
    def __init__(self):
        super().__init__()
        self.pool = QueueAwarePool(NUM_BLOCKS)
        self.waiting: list[tuple[list, tuple]] = []  # (prompt hashes, queue key)
        self.next_key = 0

    def ranks(self) -> dict:
        """hash -> the rank of its nearest waiting holder"""
        out = {}
        for hashes, key in self.waiting:
            for i, h in enumerate(hashes):
                out[h] = min(out.get(h, (*key, i)), (*key, i))
        return out

    @rule(hs=st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True), ahead=st.booleans())
    def wait(self, hs, ahead):
        """A request joins the queue, at its end or (a preempted one) ahead of everyone."""
        self.next_key += 1
        key = (-self.next_key if ahead else self.next_key,)
        hashes = [("h", h) for h in hs]
        self.waiting.append((hashes, key))
        self.pool.want(hashes, key)

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 100))
    def leave(self, i):
        hashes, key = self.waiting.pop(i % len(self.waiting))
        self.pool.unwant(hashes, key)

    @precondition(lambda self: self.pool.num_plain_free_blocks)
    @rule(hs=st.lists(st.integers(0, 5), min_size=1, max_size=NUM_BLOCKS, unique=True))
    def take_the_plain_blocks(self, hs):
        """A request takes every plain block and fills some with content: what follows evicts."""
        blocks = self.pool.allocate_n(self.pool.num_plain_free_blocks)
        self.pool.cache(blocks, [("h", h) for h in hs])
        self.holders.append(blocks)
        self.taken += len(blocks)

    @precondition(lambda self: self.pool.num_plain_free_blocks == 0 and self.pool.num_free_blocks)
    @rule()
    def evict_one(self):
        """An eviction takes a block no waiting prompt holds if there is one, else the one the queue needs last."""
        ranks = self.ranks()
        free = [b.block_hash for b in self.pool.blocks if b.ref_cnt == 0 and b.block_hash is not None]
        unheld = [h for h in free if h not in ranks]
        b = self.pool.allocate()
        evicted = next(h for h in free if h not in self.pool.cached)
        if unheld:
            assert evicted in unheld
        else:
            assert ranks[evicted] == max(ranks[h] for h in free)
        self.holders.append([b])
        self.taken += 1

    @invariant()
    def kept_are_the_free_blocks_the_queue_holds(self):
        ranks = self.ranks()
        assert set(self.pool._kept) == {b.block_id for b in self.pool.blocks
                                        if b.ref_cnt == 0 and b.block_hash in ranks}
        assert self.pool.num_kept == len(self.pool._kept)
        assert {h: r[0] for h, r in self.pool._holders.items()} == ranks


TestQueueAwarePool = QueueAwarePoolMachine.TestCase
# more runs than the profile's: an eviction among kept blocks of several ranks takes a few rules to set up
TestQueueAwarePool.settings = settings(TestQueueAwarePool.settings, max_examples=4 * settings().max_examples)


def test_evicts_blocks_no_waiting_prompt_holds_then_the_furthest_back_tail_first():
    pool = QueueAwarePool(7)
    blocks = pool.allocate_n(7)
    pool.cache(blocks, list("abcdefg"))
    pool.want(["a", "b"], (2,))  # a request second in the queue
    pool.want(["c", "d"], (1,))  # the head
    pool.want(["e"], (3,))
    pool.unwant(["e"], (3,))  # admitted or aborted: "e" is nobody's any more
    pool.free(reversed(blocks))  # tail first: g is the least recently freed
    gone = []  # the hashes evicted, one allocation at a time
    for _ in range(7):
        before = set(pool.cached)
        pool.allocate()
        gone += before - set(pool.cached)
    # the unheld in LRU order, then the second request's blocks tail first, then the head's
    assert gone == ["g", "f", "e", "b", "a", "d", "c"]


def _turn(rid: str, arrival: float, prompt: int, ids: list[int], out: int) -> Request:
    return Request(rid, num_prompt_tokens=prompt, sampling_params=SamplingParams(max_tokens=out, ignore_eos=True),
                   arrival_time=arrival, prefix_hash_ids=ids, hash_id_block_size=4, hash_ids_cover_output=True)


def _hits(num_blocks: int, max_num_seqs: int, requests: list[Request], **cache) -> dict:
    """Steps an FCFS scheduler until all finish: each request's (prefix hit tokens, first step)."""
    s = Scheduler(CacheConfig(num_gpu_blocks=num_blocks, block_size=4, watermark=0.0, **cache),
                  SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=64, max_model_len=64))
    pending = sorted(requests, key=lambda r: r.arrival_time)
    t = 0
    while pending or s.has_unfinished_requests():
        while pending and pending[0].arrival_time <= t:
            s.add_request(pending.pop(0))
        s.update_from_output(s.schedule(t), None, t + 1)
        t += 1
    return {r.request_id: (r.num_cached_tokens, r.first_scheduled_time) for r in requests}


def test_a_waiting_turn_keeps_its_history_while_the_requests_ahead_of_it_are_admitted():
    """One at a time: turn A's history (12 tokens) is freed, then X's; C, ahead of A's next turn B
    in the queue, needs two of the cached blocks. LRU evicts A's (freed first), the queue-aware
    pool X's, which nobody waits for: B hits its whole history."""
    def turns():
        return [_turn("A", 0, 8, [1, 2, 3], 5), _turn("X", 0, 8, [50, 51], 1),
                _turn("C", 0, 16, [60, 61, 62, 63], 1), _turn("B", 0, 16, [1, 2, 3, 4], 1)]

    assert _hits(7, 1, turns())["B"][0] == 4
    assert _hits(7, 1, turns(), eviction="queue")["B"][0] == 12


def test_the_queue_reserve_makes_the_head_wait_rather_than_evict_what_the_queue_would_hit():
    """While R runs, C (the head) fits only by evicting a block of A's history, which B behind it
    would hit. With the reserve C waits for R to finish (its blocks then go first) and B hits it all."""
    def turns():
        return [_turn("A", 0, 8, [1, 2, 3], 5), _turn("R", 0, 4, [90], 12),
                _turn("C", 1, 16, [60, 61, 62, 63], 1), _turn("B", 2, 16, [1, 2, 3, 4], 1)]

    plain = _hits(9, 2, turns(), eviction="queue")
    assert plain["B"][0] == 8 and plain["C"][1] == 5
    kept = _hits(9, 2, turns(), eviction="queue", queue_reserve=0.4)
    assert kept["B"][0] == 12 and kept["C"][1] == 12
