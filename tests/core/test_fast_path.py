"""The exact fast path: k uniform decode steps at once give what k single steps give."""
from hypothesis import given, settings

from paged.core.static_batching import StaticBatchScheduler

from .workloads import configs, make_request, new_scheduler, request_specs


def replay(make, specs, fast: bool):
    """Drive a scheduler with unit-length steps; arrivals join before the step at their time."""
    return replay_requests(make, lambda: [make_request(i, spec, False) for i, spec in enumerate(specs)], fast)


def replay_requests(make, requests, fast: bool):
    s = make()
    pending = sorted(requests(), key=lambda r: r.arrival_time)
    reqs = list(pending)
    t = 0.0
    windows = 0
    while pending or s.has_unfinished_requests():
        while pending and pending[0].arrival_time <= t:
            s.add_request(pending.pop(0))
        k = s.max_uniform_decode_steps() if fast else 0
        if pending:  # every step of a window must start before the next arrival
            k = min(k, int(pending[0].arrival_time - t))
        if k >= 1:
            reqs += [r for r in s.advance_decode_steps(k, t + k) if r.parent is not None]
            t += k
            windows += 1
            continue
        out = s.schedule(t)
        if out.is_empty:
            t = min([out.next_wakeup or float("inf")] + [r.arrival_time for r in pending[:1]])
            # liveness: idle with work left and nothing to wait for is a scheduler that hangs
            assert t < float("inf") or not s.has_unfinished_requests(), \
                f"the scheduler idles with unfinished requests: {s.stats()}"
            continue
        reqs += [r for r in s.update_from_output(out, None, t + 1) if r.parent is not None]
        t += 1
    records = sorted((r.request_id, r.status, r.first_scheduled_time, r.first_token_time, s.last_token_time(r),
                      r.finished_time,
                      r.num_output_tokens, r.num_preemptions, r.num_cached_tokens) for r in reqs)
    counters = (s.num_steps, s.num_scheduled_seqs, s.num_scheduled_tokens, s.num_preemptions,
                s.kv.prefix_cache_queries, s.kv.prefix_cache_hits, s.kv.pool.num_evictions)
    return records, counters, windows


@settings(max_examples=settings().max_examples * 4)
@given(cfg=configs(), specs=request_specs)
def test_fast_path_equals_stepping(cfg, specs):
    cache, sched = cfg
    stepped = replay(lambda: new_scheduler(cache, sched), specs, fast=False)
    fast = replay(lambda: new_scheduler(cache, sched), specs, fast=True)
    assert fast[:2] == stepped[:2]


@given(cfg=configs(), specs=request_specs)
def test_static_batching_fast_path_equals_stepping(cfg, specs):
    cache, sched = cfg
    cache.num_gpu_blocks = 4 * sched.max_model_len  # room for a batch of reservations
    make = lambda: StaticBatchScheduler(cache, sched, batch_size=min(3, sched.max_num_seqs),  # noqa: E731
                                        batch_timeout_s=2.0)
    stepped = replay(make, specs, fast=False)
    fast = replay(make, specs, fast=True)
    assert fast[:2] == stepped[:2]


def test_fast_path_takes_long_windows():
    """A lone batch with room to spare runs to its first finish in one window."""
    from paged import CacheConfig, Request, SchedulerConfig
    from paged.core.scheduler import Scheduler

    s = Scheduler(CacheConfig(num_gpu_blocks=100, block_size=4), SchedulerConfig(max_num_seqs=4,
                                                                                  max_num_batched_tokens=64))
    for i, out_len in enumerate([50, 80]):
        s.add_request(Request(f"{i}", num_prompt_tokens=10, max_tokens=out_len))
    s.update_from_output(s.schedule(0.0), None, 1.0)  # both prefills: one token each
    assert s.max_uniform_decode_steps() == 49
    # both computed 10 tokens: positions 12 and 16 start new blocks, at the 3rd and 7th steps
    assert s.block_needs(8) == [0, 0, 2, 0, 0, 0, 2, 0]
    done = s.advance_decode_steps(49, 50.0)
    assert [r.request_id for r in done] == ["0"] and done[0].num_output_tokens == 50
    assert s.max_uniform_decode_steps() == 30


def test_lpm_head_change_inside_a_window_matches_stepping():
    """Under LPM the head can change as decode blocks evict cached prefixes: no window may hide
    an admission that stepping would make (here a 1-sequence request behind a 3-sequence one)."""
    from paged import CacheConfig, Request, SamplingParams, SchedulerConfig
    from paged.core.scheduler import Scheduler

    def make():
        return Scheduler(CacheConfig(num_gpu_blocks=12, block_size=4, watermark=0.0),
                         SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, policy="lpm"))

    def requests():
        p = lambda max_tokens, n=1: SamplingParams(max_tokens=max_tokens, n=n, ignore_eos=True)  # noqa: E731
        return [Request("X", list(range(1000, 1024)), sampling_params=p(1)),
                Request("Y", list(range(2000, 2012)), sampling_params=p(1)),
                Request("D1", list(range(3000, 3004)), sampling_params=p(30)),
                Request("D2", list(range(4000, 4004)), sampling_params=p(30)),
                Request("A", list(range(1000, 1024)) + [7], sampling_params=p(2, n=3), arrival_time=1.0),
                Request("B", list(range(2000, 2012)) + [7], sampling_params=p(2), arrival_time=1.0)]

    assert replay_requests(make, requests, fast=True)[:2] == replay_requests(make, requests, fast=False)[:2]
