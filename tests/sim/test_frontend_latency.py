"""`SimConfig.frontend_latency_s`: a request reaches the router and the replicas that long after it
arrives, and its latencies still count from its arrival."""
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given

from sim import SimConfig, Workload, simulate

from .strategies import sim_configs, workloads

DELAY_S = 0.25


@given(workloads(), sim_configs())
def test_a_frontend_latency_is_a_later_arrival_counted_from_the_first(workload, config):
    """The run equals the run of the same requests arriving DELAY_S later (same routing, same
    steps, same tokens at the same times); only the arrival column, and so every latency, differs by
    exactly the delay."""
    config = replace(config, timeseries_interval_s=0.05)  # both runs sample at the same times
    delayed = simulate(workload, replace(config, frontend_latency_s=DELAY_S))
    later = simulate(replace(workload, arrival_s=workload.arrival_s + DELAY_S), config)
    a, b = delayed.requests, later.requests
    np.testing.assert_allclose(a.arrival_s + DELAY_S, b.arrival_s, rtol=0, atol=1e-12)
    same = [c for c in a.columns if c not in ("arrival_s", "ttft_s", "e2e_s", "queueing_delay_s")]
    assert a[same].equals(b[same])
    for c in ("ttft_s", "e2e_s", "queueing_delay_s"):
        if c in a:
            np.testing.assert_allclose(a[c], b[c] + DELAY_S, rtol=0, atol=1e-9)
    assert delayed.timeseries.equals(later.timeseries)
    assert delayed.counters == later.counters


def test_one_request_on_an_idle_replica_waits_exactly_the_frontend_latency():
    w = Workload(np.array([0.0]), np.array([100]), np.array([5]), name="one")
    config = SimConfig(model="llama-2-7b", num_gpu_blocks=64, max_model_len=256)
    base = simulate(w, config).requests.iloc[0]
    late = simulate(w, replace(config, frontend_latency_s=0.03)).requests.iloc[0]
    assert late.arrival_s == base.arrival_s == 0.0
    assert late.ttft_s == pytest.approx(base.ttft_s + 0.03, abs=1e-12)
    assert late.e2e_s == pytest.approx(base.e2e_s + 0.03, abs=1e-12)
    assert late.tpot_s == pytest.approx(base.tpot_s, abs=1e-12)


@pytest.mark.parametrize("value", [-0.001, float("nan"), 61.0])
def test_a_bad_frontend_latency_is_refused_by_name(value):
    with pytest.raises(ValueError, match="frontend_latency_s"):
        SimConfig(frontend_latency_s=value)


def test_stop_on_miss_counts_ttft_from_the_clients_arrival():
    """A TTFT target the engine meets but the client does not (the front end's latency on top)
    stops the run early only with the latency."""
    from sim.slo import SLO

    w = Workload(np.arange(200) * 0.5, np.full(200, 100), np.full(200, 5), name="spaced")
    config = SimConfig(model="llama-2-7b", num_gpu_blocks=256, max_model_len=256)
    ttft = simulate(w, config).summary()["ttft_s"]["p99"]
    slo = SLO(ttft_p99_s=ttft + 0.05, tpot_p99_s=10.0)
    assert simulate(w, config, stop_on_miss=slo).summary()["num_finished"] == 200
    assert simulate(w, replace(config, frontend_latency_s=0.1), stop_on_miss=slo).summary()["num_finished"] < 200
