"""`Scheduler.list_decode_requests` off (the simulator's driver): each output lists no decode
requests, yet counts them as a listing one does, and the scheduler runs exactly as it would
with them listed. A driver that samples must keep them listed."""
import pytest
from hypothesis import given

from .workloads import configs, make_request, new_scheduler, request_specs


def step_counts(out) -> tuple:
    return (out.num_decode_tokens, out.num_decode_requests, out.num_seqs, out.is_empty, out.num_scheduled_tokens,
            out.decode_context_sum, [r.request_id for r in out.prefill_requests], out.prefill_num_tokens,
            [r.request_id for r in out.preempted])


@given(cfg=configs(), specs=request_specs)
def test_a_scheduler_that_lists_no_decode_requests_counts_and_runs_the_same(cfg, specs):
    cache, sched = cfg
    listed, unlisted = new_scheduler(cache, sched), new_scheduler(cache, sched)
    unlisted.list_decode_requests = False
    pending = {s: sorted((make_request(i, spec, False) for i, spec in enumerate(specs)), key=lambda r: r.arrival_time)
               for s in (listed, unlisted)}
    t = 0
    while pending[listed] or listed.has_unfinished_requests():
        for s in (listed, unlisted):
            while pending[s] and pending[s][0].arrival_time <= t:
                s.add_request(pending[s].pop(0))
        a, b = listed.schedule(float(t)), unlisted.schedule(float(t))
        assert b.decode_requests == []
        assert step_counts(a) == step_counts(b)
        assert len(a.decode_requests) == a.num_decode_requests
        done = [[r.request_id for r in s.update_from_output(out, None, float(t + 1))]
                for s, out in ((listed, a), (unlisted, b))]
        assert done[0] == done[1]
        t += 1
        assert t < 10_000, "the scheduler stopped making progress"
    assert not unlisted.has_unfinished_requests()
    assert listed.stats() == unlisted.stats()


def test_tokens_for_an_output_that_lists_no_decode_requests_are_refused():
    from paged import CacheConfig, Request, SamplingParams, SchedulerConfig

    s = new_scheduler(CacheConfig(block_size=4, num_gpu_blocks=8), SchedulerConfig())
    s.list_decode_requests = False
    s.add_request(Request("0", [1, 2, 3], sampling_params=SamplingParams(max_tokens=4)))
    s.update_from_output(s.schedule(0.0), {"0": [5]}, 1.0)  # a prefill step: listed as ever
    out = s.schedule(1.0)
    assert out.num_decode_tokens == 1 and out.decode_requests == []
    with pytest.raises(ValueError, match="list_decode_requests is off"):
        s.update_from_output(out, {"0": [6]}, 2.0)
