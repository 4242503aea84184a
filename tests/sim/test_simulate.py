"""simulate(): the shared core underneath, sane results, determinism, the deployment knobs."""
import math
from dataclasses import replace

import numpy as np
import pytest

import paged.core.scheduler
from paged.core.static_batching import StaticBatchScheduler
from sim import SimConfig, Workload, load_workload, shared_prefix_workload, simulate

from .strategies import UNIT_STEPS

STEP_S = 0.01  # UNIT_STEPS: every step takes 10 ms


@pytest.fixture
def conv500(azure_conv):
    return load_workload(azure_conv, num_requests=500, max_model_len=4096)


def test_uses_the_shared_scheduler_class_itself(conv500):
    r = simulate(conv500, SimConfig(replicas=2))
    assert [type(s) for s in r.schedulers] == [paged.core.scheduler.Scheduler] * 2


def test_records_are_consistent(conv500):
    r = simulate(conv500)
    df = r.requests
    assert len(df) == 500 and (df.status == "finished_length").all()
    assert (df.arrival_s <= df.first_scheduled_s).all() and (df.first_scheduled_s <= df.first_token_s).all()
    assert (df.first_token_s <= df.finished_s).all() and (df.num_generated == df.num_output_tokens).all()
    assert np.allclose(df.e2e_s, df.finished_s - df.arrival_s)
    s = r.summary()
    for key in ("num_requests", "num_finished", "num_rejected", "simulated_time_s", "wall_time_s", "throughput_req_s",
                "output_tokens_per_s", "prefix_cache_hit_rate", "kv_usage_mean", "kv_usage_max", "num_preemptions",
                "effective_batch_size_mean"):
        assert key in s
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert set(s[key]) == {"mean", "p50", "p90", "p99"} and s[key]["p50"] <= s[key]["p99"]
    assert s["simulated_time_s"] >= df.finished_s.max()
    assert 0 < s["kv_usage_mean"] <= s["kv_usage_max"] <= 1
    assert s["output_tokens_per_s"] == pytest.approx(df.num_generated.sum() / s["simulated_time_s"])
    ts = r.timeseries
    assert list(ts.columns[:3]) == ["replica", "time_s", "kv_usage"] and len(ts) > 100
    assert (ts.num_running <= 256).all()
    g = r.goodput(ttft_slo_s=1.0, tpot_slo_s=0.1)
    assert 0 < g["goodput_req_s"] <= s["throughput_req_s"] and 0 < g["slo_attainment"] <= 1


def test_deterministic(conv500):
    a, b = simulate(conv500, SimConfig(replicas=2, router="least_kv")), simulate(conv500, SimConfig(replicas=2,
                                                                                                   router="least_kv"))
    assert a.requests.equals(b.requests) and a.timeseries.equals(b.timeseries)
    sa, sb = a.summary(), b.summary()
    for k in ("wall_time_s", "sim_requests_per_wall_s"):
        sa.pop(k), sb.pop(k)
    assert sa == sb


def test_rejects_what_can_never_run():
    w = Workload(np.array([0.0, 0.1]), np.array([100, 5000]), np.array([10, 10]))
    r = simulate(w, SimConfig(max_model_len=4096))
    s = r.summary()
    assert s["num_rejected"] == 1 and s["num_finished"] == 1
    assert r.requests.status.tolist() == ["finished_length", "rejected"]


@pytest.mark.parametrize("fast_path", [True, False])
def test_static_batching_tpot_is_what_a_streaming_client_sees(fast_path):
    """Two requests in one static batch, of 3 and 40 tokens: the short one's client has its last
    token after 2 decode steps, so its TPOT is one step, not the 39 steps until its batch ends;
    the batch still returns both (and frees their memory) at its end."""
    w = Workload(np.array([0.0, 0.0]), np.array([100, 100]), np.array([3, 40]))
    df = simulate(w, SimConfig(static_batching=True, static_batch_size=2, cost_model=UNIT_STEPS,
                               fast_path=fast_path)).requests
    short, long_ = df.iloc[0], df.iloc[1]
    assert short.finished_s == long_.finished_s == long_.last_token_s
    assert short.last_token_s == short.first_token_s + 2 * STEP_S
    assert short.tpot_s == pytest.approx(STEP_S) and long_.tpot_s == pytest.approx(STEP_S)


@pytest.mark.parametrize("fast_path", [True, False])
def test_static_batching_itl_counts_only_the_tokens_clients_get(fast_path):
    """The same batch: 2 + 39 gaps between tokens a client got, not 2 x 39 decode slots (the
    short request's slot decodes padding for 37 steps, which no client receives)."""
    w = Workload(np.array([0.0, 0.0]), np.array([100, 100]), np.array([3, 40]))
    r = simulate(w, SimConfig(static_batching=True, static_batch_size=2, cost_model=UNIT_STEPS, fast_path=fast_path))
    assert sum(r.itl_hist.values()) == 2 + 39
    assert r.summary()["itl_s"]["mean"] == pytest.approx(STEP_S)


def test_static_batching_baseline_wastes_memory(conv500):
    paged_run = simulate(conv500.head(200))
    static = simulate(conv500.head(200), SimConfig(static_batching=True, static_batch_size=8))
    assert isinstance(static.schedulers[0], StaticBatchScheduler)
    assert static.summary()["num_finished"] == 200
    # reserved but unwritten: far fewer tokens per block used than paging
    assert static.summary()["kv_tokens_mean"] / static.summary()["kv_usage_mean"] < \
        paged_run.summary()["kv_tokens_mean"] / paged_run.summary()["kv_usage_mean"]
    assert static.summary()["throughput_req_s"] <= paged_run.summary()["throughput_req_s"] * 1.001


def test_swap_and_recompute_under_memory_pressure(conv500):
    w = conv500.head(200).scale_time(0.25)
    rec = simulate(w, SimConfig(num_gpu_blocks=1500))
    swp = simulate(w, SimConfig(num_gpu_blocks=1500, preemption="swap"))
    assert rec.summary()["num_preemptions"] > 0 and swp.summary()["num_preemptions"] > 0
    assert rec.summary()["num_finished"] == swp.summary()["num_finished"] == 200
    assert (rec.requests.num_preemptions > 0).any()


def test_prefix_caching_saves_memory_and_prefill():
    w = shared_prefix_workload(100, num_groups=1, prefix_tokens=1024, suffix_tokens=64, output_tokens=64, rate=50.0)
    on, off = simulate(w), simulate(w, SimConfig(enable_prefix_caching=False))
    assert on.summary()["prefix_cache_hit_rate"] > 0.8 and off.summary()["prefix_cache_hit_rate"] == 0
    assert on.requests.prefix_hit_tokens.iloc[1:].min() >= 1008
    assert on.summary()["kv_usage_max"] < 0.6 * off.summary()["kv_usage_max"]
    assert on.summary()["ttft_s"]["mean"] < off.summary()["ttft_s"]["mean"]


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "least_kv", "prefix_aware"])
def test_replicas_share_the_load(conv500, router):
    r = simulate(conv500, SimConfig(replicas=3, router=router))
    counts = np.bincount(r.requests.replica, minlength=3)
    assert counts.sum() == 500 and counts.min() > 100
    assert r.summary()["ttft_s"]["p99"] < simulate(conv500).summary()["ttft_s"]["p99"]


def test_prefix_aware_router_keeps_groups_together():
    w = shared_prefix_workload(60, num_groups=3, prefix_tokens=512, suffix_tokens=32, output_tokens=16, rate=5.0)
    r = simulate(w, SimConfig(replicas=3, router="prefix_aware"))
    df = r.requests
    group = np.arange(60) % 3
    assert all(df.replica[group == g].nunique() == 1 for g in range(3))
    rr = simulate(w, SimConfig(replicas=3, router="round_robin", max_num_seqs=4))
    assert r.summary()["prefix_cache_hit_rate"] >= rr.summary()["prefix_cache_hit_rate"]


def test_profiled_cost_model_runs(tmp_path, conv500):
    from .test_cost_model import write_profile

    p = tmp_path / "prof.json"
    write_profile(p, np.array([2e-3, 5e-6, 1e-9, 2e-5, 3e-8, 1e-5]))
    r = simulate(conv500.head(100), SimConfig(cost_model=str(p), num_gpu_blocks=4000))
    assert r.summary()["num_finished"] == 100


def test_overrides_and_bad_config(conv500):
    r = simulate(conv500.head(20), SimConfig(), block_size=32)
    assert r.config.block_size == 32
    with pytest.raises(ValueError, match="router"):
        SimConfig(router="random")
    with pytest.raises(ValueError, match="short by"):
        simulate(conv500.head(5), SimConfig(model="llama-2-70b"))
    assert not math.isnan(simulate(conv500.head(5), replace(SimConfig(), tp=2)).summary()["ttft_s"]["mean"])


def test_samples_before_a_static_batch_timeout_show_the_idle_replica():
    import numpy as np

    from sim import SimConfig, Workload, simulate

    w = Workload(np.array([0.0]), np.array([100]), np.array([3]))
    r = simulate(w, SimConfig(static_batching=True, batch_timeout_s=0.05, timeseries_interval_s=0.01))
    ts = r.timeseries
    before = ts[ts.time_s < 0.05 - 1e-9]
    assert len(before) == 5 and (before.num_running == 0).all() and (before.num_waiting == 1).all()
    assert (before.kv_usage == 0).all()


def test_inter_token_latencies_count_the_gaps_of_preempted_requests():
    """Every gap between two tokens of a finished request is in the histogram, stalls included."""
    from sim import SimConfig, load_workload, simulate

    w = load_workload("traces/azure_llm_2023_conv.csv", num_requests=150, max_model_len=4096)
    r = simulate(w, SimConfig(num_gpu_blocks=700))
    s = r.summary()
    assert s["num_preemptions"] > 0
    done = r.finished_mask()
    assert sum(r.itl_hist.values()) == int((r.log.num_generated[done] - 1).sum())


def test_longest_inter_token_latency_per_request():
    """Between its mean (TPOT) and its whole decode span (the fast-path tests check it is exact)."""

    from sim import SimConfig, load_workload, simulate

    w = load_workload("traces/azure_llm_2023_conv.csv", num_requests=150, max_model_len=4096)
    for blocks in (700, 20_000):  # with and without preemption
        r = simulate(w, SimConfig(num_gpu_blocks=blocks)).requests
        many = r[r.num_generated > 1]
        assert many.max_itl_s.notna().all() and r[r.num_generated <= 1].max_itl_s.isna().all()
        assert (many.max_itl_s >= many.tpot_s - 1e-12).all()
        assert (many.max_itl_s <= many.finished_s - many.first_token_s + 1e-12).all()


def test_longest_step_since():
    from sim.itl import LongestStepSince

    steps = LongestStepSince()
    durations = [5, 3, 8, 2, 2, 7, 1]
    for end, d in enumerate(durations, start=1):
        steps.add(end * 10, d)
    for t in range(0, 80, 5):
        assert steps.since(t) == max([d for end, d in enumerate(durations, start=1) if end * 10 > t], default=0)


def test_busy_fraction_is_the_time_spent_in_steps():
    """Light load leaves the GPU mostly idle; everything at t=0 keeps it busy to the end."""
    w = Workload(np.array([0.0, 10.0]), np.array([100, 100]), np.array([5, 5]))
    light = simulate(w, SimConfig(step_overhead_s=0.01)).summary()
    assert 0 < light["busy_fraction"] < 0.05  # ~12 steps of ~10 ms over ~10 s
    at_once = simulate(replace(w, arrival_s=np.zeros(2)), SimConfig(step_overhead_s=0.01)).summary()
    assert at_once["busy_fraction"] == pytest.approx(1.0)


@pytest.mark.parametrize("static", [False, True])
def test_recorded_inter_token_latencies_add_up(conv500, static):
    """Every token after the first has its latency: they sum to the decode span (continuous
    batching streams; a static batch's results come back at its end), the longest is
    max_itl_s, with and without preemption."""
    for blocks in (700, None):
        config = SimConfig(num_gpu_blocks=blocks, record_itl=True, static_batching=static)
        df = simulate(conv500.head(200), config).requests
        assert [len(x) for x in df.itl_s] == (df.num_generated - 1).tolist()
        sums = np.array([x.sum() for x in df.itl_s])
        span = (df.finished_s - df.first_token_s).to_numpy()
        if static:  # a request's tokens end at its own last one; its batch may run on
            assert (sums <= span + 1e-9).all()
            np.testing.assert_allclose(sums, (df.last_token_s - df.first_token_s).to_numpy(), atol=1e-9)
        else:
            np.testing.assert_allclose(sums, span, atol=1e-9)
            many = df.num_generated > 1
            assert np.array_equal(np.array([x.max() for x in df.itl_s[many]]), df.max_itl_s[many].to_numpy())
    assert "itl_s" not in simulate(conv500.head(20)).requests  # off by default
