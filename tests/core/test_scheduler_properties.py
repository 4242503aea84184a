"""Scheduler properties over random workloads and configurations.

After every step: the token budget and max_num_seqs hold, reference counts equal holders,
each running request's block table covers exactly ceil(num_computed_tokens / block_size)
blocks, and the victim the scheduler keeps between scans is the batch's lowest. At the end:
every request finished or was rejected with a reason (liveness, also under heavy preemption),
every block is free again, chunked prefill added up to the prompt, FCFS admitted in arrival
order, and preempted requests came back with the same tokens.
"""
from hypothesis import event, given, target
from hypothesis import strategies as st

from paged import RequestStatus

from .workloads import (
    FINISHED,
    configs,
    holders_match_ref_counts,
    make_request,
    new_scheduler,
    request_specs,
    sampled_for,
    token,
)


def run(cache, sched, specs, real_tokens, abort_at=()):
    s = new_scheduler(cache, sched)
    reqs = [make_request(i, spec, real_tokens) for i, spec in enumerate(specs)]
    pending = sorted(reqs, key=lambda r: r.arrival_time)
    chunks = dict.fromkeys((r.request_id for r in reqs), 0)  # prefill tokens since the last admission
    t, steps = 0, 0
    bound = 50 * sum(r.num_prompt_tokens + r.sampling_params.max_tokens for r in reqs) + 200
    while pending or s.has_unfinished_requests():
        while pending and pending[0].arrival_time <= t:
            s.add_request(pending.pop(0))
        if t in abort_at and s.requests:
            r = s.abort(sorted(s.requests)[0], t)
            if r.parent is not None:
                reqs.append(r)
        out = s.schedule(float(t))
        assert out.num_scheduled_tokens <= sched.max_num_batched_tokens
        assert out.num_seqs <= sched.max_num_seqs and s.num_running <= sched.max_num_seqs
        assert not set(map(id, out.decode_requests)) & set(map(id, out.prefill_requests))
        for r in out.preempted:
            chunks[r.request_id] = 0
        for r, n in zip(out.prefill_requests, out.prefill_num_tokens):
            assert n >= 1 and r.num_computed_tokens + n <= r.num_tokens
            if r.num_output_tokens == 0:  # a prompt chunk (not a step after a fork)
                chunks[r.request_id] = chunks.get(r.request_id, 0) + n
        holders_match_ref_counts(s.kv)
        lowest_is_the_batch_lowest(s)
        for r in s.update_from_output(out, sampled_for(out, real_tokens), float(t + 1)):
            if r.parent is not None:
                reqs.append(r)
        lowest_is_the_batch_lowest(s)
        for r in list(s.decode.members) + list(s.prefilling):
            assert len(s.kv.tables[r.request_id]) == -(-r.num_computed_tokens // cache.block_size)
        t += 1
        steps += 1
        assert steps < bound, "the scheduler stopped making progress"
    return s, reqs, chunks


def lowest_is_the_batch_lowest(s) -> None:
    """The victim `_pick_victim` keeps between scans, when it keeps one, is the one a scan finds."""
    if s._lowest is not None:
        assert s._lowest[0] is max(s.running_requests(), key=s.policy.victim_key)


def check_end_state(s, reqs, chunks, cache, real_tokens):
    for r in reqs:
        assert r.status in FINISHED + (RequestStatus.REJECTED, RequestStatus.FINISHED_ABORTED), r
        if r.status == RequestStatus.REJECTED:
            assert r.stop_reason
            continue
        if r.status == RequestStatus.FINISHED_ABORTED:
            continue
        assert r.num_output_tokens == r.max_output_tokens
        if r.num_preemptions == 0 and r.parent is None:  # one admission's chunks add up to the uncached prompt
            assert chunks[r.request_id] == r.num_prompt_tokens - r.num_cached_tokens
        if real_tokens:
            assert r.output_token_ids == [token(r.request_id, i) for i in range(r.num_output_tokens)]
    assert s.num_rejected == sum(r.status == RequestStatus.REJECTED for r in reqs)
    for r in reqs:  # parallel sampling: every sequence of a finished request finished too
        if r.parent is None and r.status in FINISHED and r.num_preemptions == 0:
            n = r.sampling_params.n
            assert sum(c.parent is r for c in reqs) == n - 1
    s.kv.reset_prefix_cache()
    assert s.kv.num_free_blocks == cache.num_gpu_blocks and not s.kv.tables
    if s.kv.cpu_pool is not None:
        assert s.kv.cpu_pool.num_free_blocks == cache.num_cpu_blocks


@given(cfg=configs(), specs=request_specs, real_tokens=st.booleans())
def test_budgets_liveness_and_no_leaks(cfg, specs, real_tokens):
    cache, sched = cfg
    s, reqs, chunks = run(cache, sched, specs, real_tokens)
    target(float(s.num_preemptions), label="preemptions")  # steer towards preemption-heavy runs
    event(f"preempted: {s.num_preemptions > 0}")
    check_end_state(s, reqs, chunks, cache, real_tokens)
    if sched.policy == "fcfs":  # never starves an older request: admission follows arrival
        admitted = sorted((r for r in reqs if r.first_scheduled_time is not None and r.parent is None),
                          key=lambda r: r.seq)
        times = [r.first_scheduled_time for r in admitted]
        assert times == sorted(times)


@given(cfg=configs(), specs=request_specs, aborts=st.sets(st.integers(0, 60), max_size=5))
def test_aborts_in_any_state_release_all_blocks(cfg, specs, aborts):
    cache, sched = cfg
    s, reqs, chunks = run(cache, sched, specs, True, abort_at=aborts)
    check_end_state(s, reqs, chunks, cache, True)


@given(policy=st.sampled_from(["fcfs", "sjf", "priority"]),
       ops=st.lists(st.tuples(st.sampled_from(["push", "abort", "pop"]), st.integers(1, 80), st.integers(0, 10**6)),
                    max_size=40))
def test_request_queue_keeps_its_order_and_drops_aborted_entries(policy, ops):
    """Any mix of arrivals, aborts and admissions, in bursts: the queue holds exactly the live
    requests, its head is the first of them in the policy's order, and after every abort its heap
    holds at most twice the live requests (aborted ones are skipped lazily, but not kept for as
    long as a blocked head waits)."""
    from paged import Request
    from paged.core.policies import make_policy
    from paged.core.request_queue import RequestQueue

    q = RequestQueue(make_policy(policy), RequestStatus.WAITING)
    live: list = []  # (policy key, push order, request)
    pushed = 0
    for op, n, x in ops:
        for _ in range(n):
            if op == "push":
                r = Request(f"r{pushed}", num_prompt_tokens=1 + x % 50, max_tokens=1 + x % 7,
                            arrival_time=float(pushed), priority=x % 3)
                live.append((q.policy.key(r), pushed, r))
                q.push(r)
                pushed += 1
                x = x * 31 + 7
            elif op == "abort" and live:
                _, _, r = live.pop(x % len(live))
                q.discard(r)  # as the scheduler does: discard, then the status changes
                r.status = RequestStatus.FINISHED_ABORTED
                assert len(q._heap) <= 2 * len(live)
            elif op == "pop" and live:
                head = min(live, key=lambda e: e[:2])
                assert q.peek() is head[2]
                live.remove(head)
                q.pop().status = RequestStatus.RUNNING
            assert len(q) == len(live) and {id(r) for r in q} == {id(e[2]) for e in live}
