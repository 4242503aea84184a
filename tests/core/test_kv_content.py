"""The scheduler as the engine sees it: a driver that keeps the KV content of every block.

It applies each step's moves in the engine's order (swap out, swap in, copies), writes the
scheduled tokens where the block tables say, and checks that every scheduled sequence then
reads exactly its own tokens for its whole context — so a block reused within a step before
the driver has read it, or a copy that was never made, shows up as a wrong token.
"""
import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from paged.core.policies import Priority

from .workloads import (
    FINISHED,
    configs,
    holders_match_ref_counts,
    make_request,
    new_scheduler,
    request_specs,
    sampled_for,
)


class ContentDriver:
    def __init__(self, scheduler):
        self.s = scheduler
        self.gpu: dict[int, dict[int, int]] = {}  # block id -> {offset: token}
        self.cpu: dict[int, dict[int, int]] = {}

    def run(self, out) -> None:
        kv = self.s.kv
        for g, c in out.blocks_to_swap_out:
            self.cpu[c] = dict(self.gpu.get(g, {}))
        for c, g in out.blocks_to_swap_in:
            self.gpu[g] = dict(self.cpu.get(c, {}))
        for src, dst in out.blocks_to_copy:
            self.gpu[dst] = dict(self.gpu.get(src, {}))
        work = [(r, r.num_computed_tokens, 1) for r in out.decode_requests]
        work += [(r, r.num_computed_tokens, n) for r, n in zip(out.prefill_requests, out.prefill_num_tokens)]
        for r, start, n in work:
            tokens, table = r.all_token_ids(), kv.block_table(r)
            for pos in range(start, start + n):
                block_id, off = table.lookup(pos)
                assert kv.pool.blocks[block_id].ref_cnt == 1, f"{r.request_id} writes into shared block {block_id}"
                self.gpu.setdefault(block_id, {})[off] = tokens[pos]
        for r, start, n in work:  # attention reads the whole context
            tokens, table = r.all_token_ids(), kv.block_table(r)
            for pos in range(start + n):
                block_id, off = table.lookup(pos)
                assert self.gpu.get(block_id, {}).get(off) == tokens[pos], \
                    f"{r.request_id} reads position {pos} from block {block_id}: wrong content"


def replay_with_content(cache, sched, specs, aborts):
    s = new_scheduler(cache, sched)
    driver = ContentDriver(s)
    pending = sorted((make_request(i, spec, True) for i, spec in enumerate(specs)), key=lambda r: r.arrival_time)
    reqs = list(pending)
    t = 0
    while pending or s.has_unfinished_requests():
        while pending and pending[0].arrival_time <= t:
            s.add_request(pending.pop(0))
        if t in aborts and s.requests:
            s.abort(sorted(s.requests)[0], t)
        out = s.schedule(float(t))
        driver.run(out)
        s.update_from_output(out, sampled_for(out, True), float(t + 1))
        holders_match_ref_counts(s.kv)
        for r in list(s.decode.members) + list(s.prefilling):
            assert len(s.kv.block_table(r)) == -(-r.num_computed_tokens // cache.block_size)
        for rid, blocks in s.kv.cpu_tables.items():  # a swapped table holds no block it does not need
            assert len(blocks) == -(-s.requests[rid].num_computed_tokens // cache.block_size)
        t += 1
        assert t < 20_000
    return reqs


@settings(max_examples=settings().max_examples * 4)
@given(cfg=configs(), specs=request_specs, aborts=st.sets(st.integers(0, 40), max_size=3),
       priority_swap=st.booleans())
def test_every_sequence_reads_its_own_tokens(cfg, specs, aborts, priority_swap):
    cache, sched = cfg
    if priority_swap:  # the combination where blocks are freed and reused most within one step
        sched = dataclasses.replace(sched, policy=Priority(a=0.0, c=1.0), preemption_mode="swap")
        cache = dataclasses.replace(cache, num_cpu_blocks=max(cache.num_cpu_blocks, 8))
    reqs = replay_with_content(cache, sched, specs, aborts)
    assert all(r.is_finished for r in reqs)
    assert any(r.status in FINISHED for r in reqs) or aborts or all(r.stop_reason for r in reqs)


# Cases where one step frees a block and hands it out again before the driver has read it.
PRIORITY_SWAP = dict(max_num_batched_tokens=64, max_model_len=64, enable_chunked_prefill=False,
                     policy=Priority(a=0.0, c=1.0), preemption_mode="swap")


def _cache(blocks, bs):
    from paged import CacheConfig

    return CacheConfig(num_gpu_blocks=blocks, block_size=bs, num_cpu_blocks=64, enable_prefix_caching=False,
                       watermark=0.0)


def _sched(seqs):
    from paged import SchedulerConfig

    return SchedulerConfig(max_num_seqs=seqs, **PRIORITY_SWAP)


def test_copy_source_is_not_reused_by_a_swap_in_of_the_same_step():
    specs = [(0, 1, 1, False, 0, 0, 1), (0, 1, 2, False, 0, 0, 2), (0, 1, 2, False, 0, 0, 2)]
    replay_with_content(_cache(33, 2), _sched(2), specs, ())


def test_host_blocks_being_swapped_in_are_not_reused_by_a_swap_out_of_the_same_step():
    specs = [(0, 1, 1, False, 0, 0, 1)] * 5 + [(0, 1, 2, False, 1, 2, 2)] * 2 + [(3, 1, 1, False, 1, 2, 1)]
    replay_with_content(_cache(65, 1), _sched(3), specs, ())


def test_a_sequence_preempted_after_its_copy_on_write_swaps_out_its_shared_block():
    specs = [(0, 10, 4, False, 0, 0, 3), (1, 19, 2, False, 0, 10, 1)]
    replay_with_content(_cache(8, 4), _sched(8), specs, ())
