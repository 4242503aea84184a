"""The fast path gives exactly what stepping one iteration at a time gives."""
from dataclasses import replace

import hypothesis.strategies as st
import numpy as np
from hypothesis import given, settings

from sim import SimConfig, Workload, load_workload, simulate
from sim.clock import TICKS_PER_S
from sim.cluster import Cluster

from .strategies import UNIT_STEPS, sim_configs, workloads

UNTIMED = ("wall_time_s", "sim_requests_per_wall_s", "fast_path_step_fraction")


def assert_identical(a, b):
    sa, sb = a.summary(), b.summary()
    for k in UNTIMED:
        sa.pop(k), sb.pop(k)
    assert sa == sb or str(sa) == str(sb)  # str: NaN != NaN
    ra, rb = a.requests, b.requests
    if "itl_s" in ra:  # arrays per request: compared one by one
        assert all((x is None and y is None) or np.array_equal(x, y) for x, y in zip(ra.itl_s, rb.itl_s, strict=True))
        ra, rb = ra.drop(columns="itl_s"), rb.drop(columns="itl_s")
    assert ra.equals(rb)
    assert a.timeseries.equals(b.timeseries)
    assert a.itl_hist == b.itl_hist
    assert a.itl_weighted_ticks == b.itl_weighted_ticks
    for sa, sb in zip(a.schedulers, b.schedulers, strict=True):
        assert (sa.num_steps, sa.num_scheduled_seqs, sa.num_scheduled_tokens, sa.num_preemptions,
                sa.kv.prefix_cache_hits, sa.kv.pool.num_evictions) == \
               (sb.num_steps, sb.num_scheduled_seqs, sb.num_scheduled_tokens, sb.num_preemptions,
                sb.kv.prefix_cache_hits, sb.kv.pool.num_evictions)


@settings(max_examples=settings().max_examples * 4)
@given(workloads(), sim_configs())
def test_fast_path_is_exact(workload, config):
    fast = simulate(workload, replace(config, fast_path=True))
    step = simulate(workload, replace(config, fast_path=False))
    assert step.counters["num_windows"] == 0
    assert_identical(fast, step)


@settings(max_examples=settings().max_examples * 4)
@given(workloads(), sim_configs(), st.booleans())
def test_the_itl_summary_counts_every_gap_a_client_sees_once(workload, config, static):
    """The summary's ITL histogram, filled a window at a time, holds exactly the gaps recorded
    token by token (--record-itl): as many, summing to the same ticks. A static batch's padding
    slots, decoding for members that have stopped, are in neither."""
    r = simulate(workload, replace(config, record_itl=True, static_batching=config.static_batching or static))
    gaps = [x for x in r.requests.itl_s if x is not None]
    assert sum(r.itl_hist.values()) == sum(len(x) for x in gaps)
    assert r.itl_weighted_ticks == sum(int(round(v * TICKS_PER_S)) for x in gaps for v in x)


def test_fast_path_on_a_real_trace_takes_windows_and_agrees(azure_conv):
    w = load_workload(azure_conv, num_requests=400, max_model_len=4096)
    config = SimConfig(num_gpu_blocks=2000)  # small enough to preempt
    fast, step = simulate(w, config), simulate(w, replace(config, fast_path=False))
    assert fast.counters["num_window_steps"] > fast.counters["num_steps"] // 2
    assert fast.summary()["num_preemptions"] > 0
    assert_identical(fast, step)


def test_an_arrival_at_a_step_boundary_is_seen_by_that_step():
    # Request 0 decodes in 10 ms steps from t=10 ms; request 1 arrives at exactly t=50 ms,
    # the start of a step inside what would otherwise be one long window.
    w = Workload(np.array([0.0, 0.05]), np.array([16, 16]), np.array([40, 5]))
    for fast in (True, False):
        r = simulate(w, SimConfig(cost_model=UNIT_STEPS, fast_path=fast, timeseries_interval_s=1.0))
        df = r.requests
        assert df.first_scheduled_s[1] == 0.05 and df.first_token_s[1] == 0.06
        assert df.finished_s[0] == 0.4  # 40 tokens, one per 10 ms step
    fast, step = (simulate(w, SimConfig(cost_model=UNIT_STEPS, fast_path=f, timeseries_interval_s=0.1))
                  for f in (True, False))
    assert fast.counters["num_windows"] >= 2
    assert_identical(fast, step)


@settings(max_examples=settings().max_examples * 4)
@given(workloads(), sim_configs(), st.booleans())
def test_a_lone_replica_pulling_its_arrivals_runs_as_with_an_event_per_arrival(workload, config, fast):
    """`Cluster.pull_arrivals`: a lone unwatched replica handed its arrivals before each step ends
    (static batching's timers and requests rejected while idle included) runs exactly as when each
    arrival is an event of its own."""
    config = replace(config, replicas=1, fast_path=fast)
    pulled = simulate(workload, config)
    Cluster.pull_arrivals = False
    try:
        pushed = simulate(workload, config)
    finally:
        Cluster.pull_arrivals = True
    assert_identical(pulled, pushed)
    assert pulled.summary()["simulated_time_s"] == pushed.summary()["simulated_time_s"]
