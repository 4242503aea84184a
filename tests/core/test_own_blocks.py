"""A request named by trace hash ids caches, evicts and hits as the engine does with its tokens.

The engine hashes every full block of a token-id request, the blocks no other request shares too
(the rest of the prompt, the output), so they take room in the prefix cache and age there. The
simulator sees only the ids a trace gives; past them a request's blocks are its own
(`paged.core.hashing.own_block_hashes`). Property: a workload of shared prefixes named by ids and
unique rest steps exactly as the same workload given as tokens (equal prefix tokens, unique others,
unique sampled tokens): the same prefills, decodes, hits and evictions at every step, preemptions
by recompute (which hit a request's own blocks) included.
"""
from hypothesis import given, settings
from hypothesis import strategies as st

from paged import CacheConfig, Request, SamplingParams, SchedulerConfig
from paged.core.hashing import extend_block_hashes, id_block_hashes
from paged.core.scheduler import Scheduler

BLOCK = 4

specs = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 9), st.integers(1, 9),
                           st.integers(0, 3)), min_size=1, max_size=12)  # group, id blocks, own, outputs, delay


def requests(spec, as_tokens: bool) -> list[tuple[int, Request]]:
    out, t = [], 0
    for i, (group, id_blocks, own, outputs, delay) in enumerate(spec):
        t += delay
        ids = [group * 100 + j for j in range(id_blocks)]
        own = own or (0 if id_blocks else 1)
        params = SamplingParams(max_tokens=outputs, ignore_eos=True)
        if as_tokens:
            prompt = [x * BLOCK + k for x in ids for k in range(BLOCK)] + [100_000 + 1000 * i + k for k in range(own)]
            req = Request(str(i), prompt, sampling_params=params)
        else:
            req = Request(str(i), num_prompt_tokens=id_blocks * BLOCK + own, sampling_params=params,
                          prefix_hash_ids=ids, hash_id_block_size=BLOCK)
        out.append((t, req))
    return out


def trajectory(spec, blocks: int, as_tokens: bool) -> list[tuple]:
    s = Scheduler(CacheConfig(num_gpu_blocks=blocks, block_size=BLOCK, watermark=0.0),
                  SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64))
    pending, steps, fresh = requests(spec, as_tokens), [], iter(range(200_000, 10**9))
    t = 0
    while pending or s.has_unfinished_requests():
        while pending and pending[0][0] <= t:
            s.add_request(pending.pop(0)[1])
        out = s.schedule(float(t))
        sampled = None
        if as_tokens:
            sampled = {r.request_id: [next(fresh)] for r in (*out.decode_requests, *out.prefill_requests)}
        s.update_from_output(out, sampled, float(t))
        kv = s.kv
        steps.append((sorted(r.request_id for r in out.decode_requests),
                      [(r.request_id, n) for r, n in zip(out.prefill_requests, out.prefill_num_tokens, strict=True)],
                      sorted(r.request_id for r in out.preempted), kv.prefix_cache_queries, kv.prefix_cache_hits,
                      kv.pool.num_evictions, len(kv.pool.cached)))
        t += 1
        assert t < 2000
    return steps


@settings(max_examples=60, deadline=None)
@given(specs, st.integers(8, 24))
def test_ids_and_unique_rest_step_as_tokens(spec, blocks):
    assert trajectory(spec, blocks, as_tokens=False) == trajectory(spec, blocks, as_tokens=True)


def test_own_blocks_past_the_ids_are_hashed_and_unique():
    a = Request("a", num_prompt_tokens=10, max_tokens=4, prefix_hash_ids=[7], hash_id_block_size=8)
    b = Request("b", num_prompt_tokens=10, max_tokens=4, prefix_hash_ids=[7], hash_id_block_size=8)
    ha, hb = extend_block_hashes(a, 4, 5), extend_block_hashes(b, 4, 5)
    assert len(ha) == 2  # 10 tokens: 2 full blocks (the third fills only with outputs)
    assert ha[:2] == hb[:2] == id_block_hashes([7], 8, 4, 2)  # named by the id: shared
    a.num_output_base = b.num_output_base = 4  # 14 tokens: block 2 is full, its content a's and b's own
    ha, hb = extend_block_hashes(a, 4, 5), extend_block_hashes(b, 4, 5)
    assert len(ha) == len(hb) == 3 and ha[2] != hb[2]
