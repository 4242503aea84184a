"""Focused scheduler behaviours: policies, preemption modes, parallel sampling, bad input."""
import pytest

from paged import CacheConfig, Request, RequestStatus, SamplingParams, SchedulerConfig
from paged.core.policies import Priority
from paged.core.scheduler import Scheduler
from paged.core.static_batching import StaticBatchScheduler

from .workloads import holders_match_ref_counts


def drive(s, now=0.0, sampled=None, max_steps=10_000):
    finished = []
    steps = 0
    while s.has_unfinished_requests():
        out = s.schedule(now)
        now += 1.0
        tokens = sampled(out) if sampled else None
        finished += s.update_from_output(out, tokens, now)
        holders_match_ref_counts(s.kv)
        steps += 1
        assert steps < max_steps
    return finished, now


def make(num_blocks=64, bs=4, **sched):
    sched.setdefault("max_num_batched_tokens", 64)
    sched.setdefault("max_num_seqs", 8)
    return Scheduler(CacheConfig(num_gpu_blocks=num_blocks, block_size=bs, num_cpu_blocks=sched.pop("cpu", 0)),
                     SchedulerConfig(**sched))


# -- bad input -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, field", [
    (dict(num_gpu_blocks=8, block_size=12), "block_size"),
    (dict(num_gpu_blocks=0), "num_gpu_blocks"),
    (dict(num_gpu_blocks=8, watermark=1.0), "watermark"),
    (dict(num_gpu_blocks=8, watermark=-0.1), "watermark"),
    (dict(num_gpu_blocks=8, num_cpu_blocks=-1), "num_cpu_blocks"),
    (dict(num_gpu_blocks=True), "num_gpu_blocks"),  # a bool is no count
    (dict(num_gpu_blocks=8, block_size=True), "block_size"),
    (dict(num_gpu_blocks=8.0), "num_gpu_blocks"),
    (dict(num_gpu_blocks=8, watermark="x"), "watermark"),
])
def test_cache_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"CacheConfig\.{field}="):
        CacheConfig(**kwargs)


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(max_num_seqs=64, max_num_batched_tokens=32), "max_num_batched_tokens"),
    (dict(enable_chunked_prefill=False, max_num_batched_tokens=512, max_model_len=4096), "max_num_batched_tokens"),
    (dict(policy="random"), "policy"),
    (dict(preemption_mode="kill"), "preemption_mode"),
    (dict(long_prefill_token_threshold=-1), "long_prefill_token_threshold"),
    (dict(max_num_seqs=True), "max_num_seqs"),
])
def test_scheduler_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"SchedulerConfig\.{field}="):
        SchedulerConfig(**kwargs)


def test_budget_below_block_size_is_refused():
    with pytest.raises(ValueError, match="max_num_batched_tokens=32: expected >= block_size \\(64\\)"):
        Scheduler(CacheConfig(num_gpu_blocks=8, block_size=64),
                  SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32))


def test_numpy_integers_are_integers():
    import numpy as np

    assert CacheConfig(num_gpu_blocks=np.int64(8), block_size=np.int32(4)).num_gpu_slots == 32
    assert Request("x", num_prompt_tokens=np.int64(5)).num_prompt_tokens == 5


def test_prompt_length_must_be_an_integer():
    with pytest.raises(ValueError, match=r"num_prompt_tokens=2\.5: expected an integer"):
        Request("x", num_prompt_tokens=2.5)


def test_top_k_minus_one_means_off_as_in_vllm():
    assert SamplingParams(top_k=-1).top_k == SamplingParams(top_k=0).top_k == 0


def test_empty_prompt_is_an_error():
    with pytest.raises(ValueError, match="empty prompt"):
        Request("x", [])
    with pytest.raises(ValueError, match="empty prompt"):
        Request("x", num_prompt_tokens=0)


@pytest.mark.parametrize("kwargs", [dict(max_tokens=0), dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5),
                                    dict(n=0), dict(top_k=-2)])
def test_bad_sampling_params(kwargs):
    with pytest.raises(ValueError, match="SamplingParams"):
        SamplingParams(**kwargs)


def test_requests_that_can_never_run_are_rejected_and_counted():
    s = make(num_blocks=8, bs=4, max_model_len=100)  # the cache holds 32 tokens
    too_long = Request("a", num_prompt_tokens=101, max_tokens=1)
    too_big = Request("b", num_prompt_tokens=40, max_tokens=1)
    ok = Request("c", num_prompt_tokens=30, max_tokens=50)
    for r in (too_long, too_big, ok):
        s.add_request(r)
    assert too_long.status == RequestStatus.REJECTED and "max_model_len=100" in too_long.stop_reason
    assert too_big.status == RequestStatus.REJECTED and "never fit" in too_big.stop_reason
    assert s.num_rejected == 2 and "a" not in s.requests and "b" not in s.requests
    drive(s)
    # the output is capped at the cache's size, so a lone request always finishes
    assert ok.status == RequestStatus.FINISHED_LENGTH and ok.num_output_tokens == 2
    s.add_request(Request("x", num_prompt_tokens=1))
    with pytest.raises(ValueError, match="'x' is already in the scheduler"):
        s.add_request(Request("x", num_prompt_tokens=1))


# -- preemption --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_resumes_with_the_same_tokens(mode):
    s = make(num_blocks=12, bs=4, max_num_seqs=4, preemption_mode=mode, cpu=32)
    for i in range(4):
        s.add_request(Request(f"{i}", list(range(i, i + 10)), sampling_params=SamplingParams(max_tokens=12,
                                                                                               ignore_eos=True)))
    swapped = []

    def sampled(out):
        swapped.extend(out.blocks_to_swap_out)
        toks = {r.request_id: [100 * int(r.request_id) + r.num_output_tokens] for r in out.decode_requests}
        for r, n in zip(out.prefill_requests, out.prefill_num_tokens):
            if r.num_computed_tokens + n == r.num_tokens:
                toks[r.request_id] = [100 * int(r.request_id) + r.num_output_tokens]
        return toks

    finished, _ = drive(s, sampled=sampled)
    assert s.num_preemptions > 0
    assert bool(swapped) == (mode == "swap")
    for r in finished:
        assert r.output_token_ids == [100 * int(r.request_id) + i for i in range(12)]


def test_priority_arrival_preempts_lower_priority_work():
    s = make(num_blocks=64, bs=4, max_num_seqs=2, policy=Priority(a=0.0, c=1.0))
    low = [Request(f"low{i}", num_prompt_tokens=8, max_tokens=50, business_value=0.0) for i in range(2)]
    for r in low:
        s.add_request(r)
    s.update_from_output(s.schedule(0.0), None, 1.0)
    high = Request("high", num_prompt_tokens=8, max_tokens=5, business_value=10.0, arrival_time=1.0)
    s.add_request(high)
    out = s.schedule(1.0)
    assert out.preempted == [low[1]] and high in out.prefill_requests
    finished, _ = drive(s, now=2.0)
    assert finished[0] is high


def test_sjf_and_edf_orders():
    for policy, first in [("sjf", "short"), ("edf", "urgent")]:
        s = make(max_num_seqs=1, policy=policy)
        s.add_request(Request("long", num_prompt_tokens=30, max_tokens=30, deadline=100.0))
        s.add_request(Request("short", num_prompt_tokens=5, max_tokens=2, deadline=50.0))
        s.add_request(Request("urgent", num_prompt_tokens=20, max_tokens=20, deadline=10.0))
        finished, _ = drive(s)
        assert finished[0].request_id == first


def test_lpm_prefers_the_longest_cached_prefix():
    s = make(max_num_seqs=1, policy="lpm", num_blocks=64)
    s.add_request(Request("warm", list(range(40)), sampling_params=SamplingParams(max_tokens=1)))
    drive(s, sampled=lambda out: {r.request_id: [0] for r in out.prefill_requests + out.decode_requests})
    s.add_request(Request("cold", list(range(100, 140)), sampling_params=SamplingParams(max_tokens=1)))
    s.add_request(Request("hit", list(range(40)) + [7], sampling_params=SamplingParams(max_tokens=1)))
    finished, _ = drive(s, sampled=lambda out: {r.request_id: [0] for r in out.prefill_requests + out.decode_requests})
    assert [r.request_id for r in finished] == ["hit", "cold"]
    assert finished[0].num_cached_tokens == 40


def test_prefix_caching_counts_hits_like_vllm():
    s = make(num_blocks=64, bs=4)
    for i in range(3):
        s.add_request(Request(f"{i}", list(range(20)) + [50 + i], sampling_params=SamplingParams(max_tokens=1)))
        drive(s, sampled=lambda out: {r.request_id: [0] for r in out.prefill_requests})
    st = s.stats()
    assert st.prefix_cache_queries == 3 * 21 and st.prefix_cache_hits == 2 * 20
    assert "vllm:prefix_cache_hits_total 40" in st.to_prometheus()


# -- parallel sampling ---------------------------------------------------------------------------------------
def test_parallel_sampling_forks_with_copy_on_write():
    s = make(num_blocks=64, bs=4)
    parent = Request("p", list(range(10)), sampling_params=SamplingParams(n=3, max_tokens=4, ignore_eos=True))
    s.add_request(parent)
    copies = []

    def sampled(out):
        copies.extend(out.blocks_to_copy)
        toks = {}
        for r in out.decode_requests:
            toks[r.request_id] = [r.index * 10 + r.num_output_tokens]
        for r, n in zip(out.prefill_requests, out.prefill_num_tokens):
            if r.num_computed_tokens + n == r.num_tokens:
                k = r.sampling_params.n if r.parent is None and r.num_output_tokens == 0 else 1
                toks[r.request_id] = [r.index * 10 + i for i in range(k)] if k > 1 else [r.index * 10 +
                                                                                        r.num_output_tokens]
        return toks

    finished, _ = drive(s, sampled=sampled)
    outs = {r.request_id: r.output_token_ids for r in finished}
    assert outs == {"p": [0, 1, 2, 3], "p-1": [1, 11, 12, 13], "p-2": [2, 21, 22, 23]}
    # 10 prompt tokens: the third block is shared half full; two of the three sequences copy it
    assert len(copies) == 2
    s.kv.reset_prefix_cache()
    assert s.kv.num_free_blocks == 64


# -- static batching -----------------------------------------------------------------------------------------
def test_static_batching_reserves_and_returns_together():
    s = StaticBatchScheduler(CacheConfig(num_gpu_blocks=64, block_size=4), SchedulerConfig(max_model_len=64),
                             batch_size=2, batch_timeout_s=0.5)
    a = Request("a", num_prompt_tokens=10, max_tokens=3, arrival_time=0.0)
    s.add_request(a)
    out = s.schedule(0.1)
    assert out.is_empty and out.next_wakeup == 0.5
    b = Request("b", num_prompt_tokens=6, max_tokens=9, arrival_time=0.2)
    s.add_request(b)
    out = s.schedule(0.2)
    assert out.num_prefill_tokens == 2 * 10  # padded to the longest prompt
    assert s.kv.pool.num_used_blocks == -(-13 // 4) + -(-15 // 4)
    finished, _ = drive(s, now=1.0)
    assert a.finished_time == b.finished_time  # returned together
    assert a.num_output_tokens == 3 and b.num_output_tokens == 9
    # but a's client had its last token six steps before the batch ended
    assert s.last_token_time(b) == b.finished_time and s.last_token_time(a) == a.finished_time - 6


def test_a_static_batch_may_not_exceed_max_num_seqs():
    """Every step runs the whole batch: a batch of 8 under max_num_seqs=2 would run 8 sequences."""
    with pytest.raises(ValueError, match="batch_size=8: expected at most SchedulerConfig.max_num_seqs=2"):
        StaticBatchScheduler(CacheConfig(num_gpu_blocks=64, block_size=4), SchedulerConfig(max_num_seqs=2),
                             batch_size=8)


def test_stats_report_fragmentation_and_usage():
    s = make(num_blocks=10, bs=8)
    s.add_request(Request("a", num_prompt_tokens=9, max_tokens=10))
    s.update_from_output(s.schedule(0.0), None, 1.0)
    st = s.stats()
    assert st.kv_cache_usage_perc == pytest.approx(0.2)
    assert st.fragmentation == pytest.approx(7 / 16)  # 9 of 16 allocated slots hold a token
    assert st.num_requests_running == 1 and st.effective_batch_size == 1


def test_static_batch_ends_when_an_abort_takes_its_last_live_member():
    s = StaticBatchScheduler(CacheConfig(num_gpu_blocks=64, block_size=4), SchedulerConfig(max_model_len=64),
                             batch_size=2, batch_timeout_s=0.0)
    a, b = Request("a", num_prompt_tokens=4, max_tokens=2), Request("b", num_prompt_tokens=4, max_tokens=10)
    s.add_request(a)
    s.add_request(b)
    for t in range(3):
        s.update_from_output(s.schedule(float(t)), None, t + 1.0)
    assert a.num_output_tokens == 2 and a.status == RequestStatus.RUNNING  # done, waiting for the batch
    s.abort("b", 3.0)
    finished = s.update_from_output(s.schedule(3.0), None, 4.0)
    assert finished == [a] and a.status == RequestStatus.FINISHED_LENGTH
    assert not s.has_unfinished_requests() and s.kv.num_free_blocks == 64


def test_static_batching_rejects_parallel_sampling():
    s = StaticBatchScheduler(CacheConfig(num_gpu_blocks=64, block_size=4), SchedulerConfig(max_model_len=64))
    r = Request("a", list(range(4)), sampling_params=SamplingParams(n=2))
    s.add_request(r)
    assert r.status == RequestStatus.REJECTED and "parallel sampling" in r.stop_reason


def test_a_policy_whose_keys_tie_is_fine():
    from dataclasses import dataclass

    from paged.core.policies import Policy

    @dataclass(slots=True)
    class Lottery(Policy):
        name = "flat"

        def key(self, request, kv=None):
            return (0,)

    s = make(policy=Lottery(), max_num_seqs=2)
    for i in range(5):
        s.add_request(Request(f"{i}", num_prompt_tokens=4, max_tokens=3))
    finished, _ = drive(s)
    assert len(finished) == 5


def test_forked_sequences_never_take_a_users_request_id():
    s = make(num_blocks=64, bs=4)
    user = Request("a-1", list(range(5)), sampling_params=SamplingParams(max_tokens=20, ignore_eos=True))
    parent = Request("a", list(range(9)), sampling_params=SamplingParams(max_tokens=3, n=2, ignore_eos=True))
    s.add_request(user)
    s.add_request(parent)
    finished, _ = drive(s, sampled=lambda out: {r.request_id: [1] * (r.sampling_params.n if r.parent is None
                                                                          and r.num_output_tokens == 0 else 1)
                                                for r in out.decode_requests + out.prefill_requests})
    assert len(finished) == 3 and len({r.request_id for r in finished}) == 3
    s.kv.reset_prefix_cache()
    assert s.kv.num_free_blocks == 64


def test_no_preemption_that_cannot_make_room():
    """A high-priority request needing two sequences, with one lower-priority sequence to take:
    preempting it would not admit the request, so nothing is thrown away."""
    s = make(num_blocks=64, bs=4, max_num_seqs=2, policy=Priority(a=0.0, c=1.0))
    top = Request("top", num_prompt_tokens=8, max_tokens=40, business_value=5.0)
    low = Request("low", num_prompt_tokens=8, max_tokens=40, business_value=0.0)
    s.add_request(top)
    s.add_request(low)
    for t in range(5):
        s.update_from_output(s.schedule(float(t)), None, t + 1.0)
    s.add_request(Request("pair", num_prompt_tokens=8, sampling_params=SamplingParams(max_tokens=5, n=2),
                          business_value=1.0, arrival_time=5.0))
    out = s.schedule(5.0)
    assert out.preempted == [] and low.num_preemptions == 0


def test_parallel_samples_that_each_need_the_others_room_do_not_deadlock():
    """Found by the thorough profile: two sequences of one n=2 request, preempted and
    recomputing without a prefix cache, each held half of what the other needed; ranked equal,
    neither could preempt the other and both waited forever. Family members now rank in order."""
    s = Scheduler(CacheConfig(num_gpu_blocks=65, block_size=1, enable_prefix_caching=False, watermark=0.0),
                  SchedulerConfig(max_num_seqs=5, max_num_batched_tokens=25, max_model_len=64,
                                  long_prefill_token_threshold=20))
    for i, (plen, max_tokens, n) in enumerate([(1, 1, 1), (1, 1, 1), (1, 1, 1), (1, 5, 1), (1, 5, 1), (55, 2, 2)]):
        s.add_request(Request(f"{i}", num_prompt_tokens=plen,
                              sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True, n=n)))
    for step in range(200):
        if not s.has_unfinished_requests():
            break
        out = s.schedule(float(step))
        assert not out.is_empty, f"nothing scheduled with work left at step {step}: {s.stats()}"
        s.update_from_output(out, None, float(step + 1))
    assert not s.has_unfinished_requests() and s.num_finished == 7 and s.num_preemptions > 0


def test_aborted_queued_requests_are_not_kept():
    """Queued requests aborted behind a head that cannot be admitted are skipped lazily; they
    must still be dropped once they outnumber the live ones, or a long-lived driver keeps them all."""
    s = make(num_blocks=8, bs=4, max_num_seqs=1)  # fcfs: a static order, kept in a heap
    s.add_request(Request("head", list(range(8)), sampling_params=SamplingParams(max_tokens=100)))
    s.schedule(0.0)  # running; it holds the only sequence slot, so the queue stays blocked
    s.add_request(Request("blocked", [1, 2], sampling_params=SamplingParams(max_tokens=2)))  # the queue's head
    for i in range(200):
        s.add_request(Request(f"r{i}", [i, i + 1], sampling_params=SamplingParams(max_tokens=2)))
        s.abort(f"r{i}")
        s.schedule(float(i))
    assert len(s.waiting._heap) <= 3 and len(s.waiting) == 1
