"""Random workloads and configurations for the scheduler's property tests, and a driver."""
import zlib

import hypothesis.strategies as st

from paged import CacheConfig, Request, RequestStatus, SamplingParams, SchedulerConfig
from paged.core.block_table import BlockCount, BlockTable
from paged.core.scheduler import Scheduler

MAX_MODEL_LEN = 64
PREFIX = list(range(100, 140))


def token(rid: str, pos: int) -> int:
    """The token a deterministic 'model' samples: a function of the sequence and position only,
    so a request that is preempted and recomputed must come back with the same tokens."""
    return zlib.crc32(f"{rid}/{pos}".encode()) % 50


@st.composite
def configs(draw):
    bs = draw(st.sampled_from([1, 2, 4, 8, 16]))
    max_num_seqs = draw(st.integers(1, 8))
    chunked = draw(st.booleans())
    budget = draw(st.integers(max(max_num_seqs, bs), 96))
    if not chunked:
        budget = max(budget, MAX_MODEL_LEN)
    # from "one request barely fits" to roomy
    num_blocks = draw(st.integers(-(-(MAX_MODEL_LEN + 1) // bs), 3 * MAX_MODEL_LEN // bs + 2))
    mode = draw(st.sampled_from(["recompute", "swap"]))
    policy = draw(st.sampled_from(["fcfs", "priority", "sjf", "edf", "lpm"]))
    eviction = "lru" if policy == "lpm" else draw(st.sampled_from(["lru", "queue"]))  # queue: a static order
    cache = CacheConfig(num_gpu_blocks=num_blocks, block_size=bs,
                        num_cpu_blocks=draw(st.integers(0, num_blocks)) if mode == "swap" else 0,
                        enable_prefix_caching=draw(st.booleans()),
                        watermark=draw(st.sampled_from([0.0, 0.01, 0.1])), eviction=eviction,
                        queue_reserve=draw(st.sampled_from([0.0, 0.1, 0.3])) if eviction == "queue" else 0.0)
    sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=MAX_MODEL_LEN,
                            enable_chunked_prefill=chunked,
                            long_prefill_token_threshold=draw(st.sampled_from([0, 0, 8, 20])),
                            policy=policy, preemption_mode=mode)
    return cache, sched


# (arrival step, prompt length, max tokens, shares the common prefix, priority, business value, n)
request_specs = st.lists(
    st.tuples(st.integers(0, 30), st.integers(1, MAX_MODEL_LEN + 6), st.integers(1, 24), st.booleans(),
              st.integers(0, 2), st.integers(0, 5), st.sampled_from([1, 1, 1, 2, 3])),
    min_size=1, max_size=12)


def make_request(i, spec, real_tokens: bool) -> Request:
    """A request of the spec, with real token ids (the engine) or lengths only (the simulator)."""
    arrival, plen, max_tokens, shared, prio, value, n = spec
    kw = dict(arrival_time=float(arrival), priority=prio, business_value=float(value), deadline=float(arrival + plen))
    if real_tokens:
        own = [token(f"{i}", -p - 1) for p in range(plen)]
        prompt = ((PREFIX + own) if shared else own)[:plen]
        return Request(f"{i}", prompt, sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True, n=n),
                       **kw)
    return Request(f"{i}", num_prompt_tokens=plen, sampling_params=SamplingParams(max_tokens=max_tokens,
                                                                                  ignore_eos=True, n=n),
                   prefix_hash_ids=[0, 1] if shared else None, hash_id_block_size=16, **kw)


def sampled_for(out, real_tokens: bool):
    """Tokens for every sequence that samples in the step; n of them for a parallel-sampling
    request finishing its prompt (one per sequence it forks into)."""
    if not real_tokens:
        return None
    sampled = {r.request_id: [token(r.request_id, r.num_output_tokens)] for r in out.decode_requests}
    for r, n in zip(out.prefill_requests, out.prefill_num_tokens):
        if r.num_computed_tokens + n == r.num_tokens:
            k = r.sampling_params.n if r.parent is None and r.num_output_tokens == 0 else 1
            ids = [r.request_id] + [f"{r.request_id}-{j}" for j in range(1, k)]
            sampled[r.request_id] = [token(x, r.num_output_tokens) for x in ids]
    return sampled


def holders_match_ref_counts(kv) -> None:
    counts = [0] * kv.pool.num_blocks
    for table in kv.tables.values():
        for b in table.blocks:
            counts[b.block_id] += 1
    assert [b.ref_cnt for b in kv.pool.blocks] == counts
    lent = sum(len(t) for t in kv.tables.values() if isinstance(t, BlockCount))  # length-only requests
    assert kv.pool.num_lent == lent
    assert kv.num_free_blocks == counts.count(0) - lent
    assert kv.num_named_tables == sum(isinstance(t, BlockTable) for t in kv.tables.values())


def new_scheduler(cache, sched):
    return Scheduler(cache, sched)


FINISHED = (RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_STOPPED)
