"""`experiments/sim_vs_real.py --quick` closes the loop end to end: it profiles the engine, simulates
a slice of the trace, replays it on the engine in real time and writes what it promises.

A quick slice (8 requests, a 6-point profile) is far too noisy to test accuracy, so this checks
structure and sanity only: every metric has a finite prediction and measurement, both sides served
every request with every output token, and the latencies are positive.
"""
import json
import math

import numpy as np
import pandas as pd
import pytest

from .test_experiments import load

pytest.importorskip("torch")

METRICS = [f"{name}_{stat}" for name in ("ttft", "tpot", "e2e") for stat in ("mean", "p50", "p90")] + [
    "throughput_req_s", "output_tokens_per_s"]


def test_sim_vs_real_quick(tmp_path):
    assert load("sim_vs_real").main(["--quick", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "sim_vs_real.json").read_text())
    assert set(result["metrics"]) == set(METRICS)
    for name, m in result["metrics"].items():
        assert set(m) == {"predicted", "measured", "rel_error"}, name
        assert all(isinstance(v, float) and math.isfinite(v) for v in m.values()), (name, m)
        assert m["predicted"] > 0 and m["measured"] > 0, (name, m)
        assert m["rel_error"] == pytest.approx((m["predicted"] - m["measured"]) / m["measured"])

    requests = pd.read_csv(tmp_path / "sim_vs_real_requests.csv")
    assert len(requests) == result["conditions"]["num_requests"] == 8
    for side in ("predicted", "measured"):
        assert (requests[f"{side}_num_generated"] == requests.num_output_tokens).all()
        assert requests[f"{side}_finished_s"].notna().all()
        assert (requests[f"{side}_ttft"] > 0).all()
        assert (requests[f"{side}_e2e"] >= requests[f"{side}_ttft"]).all()
    steps = pd.read_csv(tmp_path / "sim_vs_real_steps.csv")
    assert (steps.step_s >= steps.forward_s).all() and (steps.predicted_s > 0).all()
    assert ((steps.cpu_s > 0) & (steps.cpu_s <= steps.step_s + 1e-3)).all()  # a thread's CPU time within its wall time
    assert set(pd.read_csv(tmp_path / "sim_vs_real.csv").metric) == set(METRICS)
    assert (tmp_path / "sim_vs_real.png").stat().st_size > 10_000
    assert (tmp_path / "profile.json").exists() and "[" in (tmp_path / "verdicts.txt").read_text()


def test_the_load_is_the_busiest_well_conditioned_one(monkeypatch):
    """`choose_load` replays the busiest load where no goal metric moves by more than MAX_ELASTICITY times a
    change of step time, and the least ill-conditioned one when none qualifies."""
    m = load("sim_vs_real")
    worst = {0.3: 1.2, 0.4: 2.5, 0.5: 1.4, 0.6: 1.7}
    monkeypatch.setattr(m, "at_load", lambda trace, rate: rate)
    monkeypatch.setattr(m, "elasticities", lambda w, config, fit: {"ttft_mean": -worst[w], "tpot_mean": 1.0})
    assert m.MAX_ELASTICITY == 1.5 and m.choose_load(None, None, None, 1.0, tuple(worst)) == (0.5, worst)
    worst = {0.5: 1.9, 0.6: 1.7, 0.7: 3.0}
    assert m.choose_load(None, None, None, 1.0, tuple(worst)) == (0.6, worst)


def test_sampling_error_is_paired():
    """`sampling_error` redraws requests with their prediction and measurement together: a prediction that is
    every measurement x1.1 is off by 10% in every draw (no spread); the spread of a noisy prediction
    shrinks as requests are added."""
    m = load("sim_vs_real")
    rng = np.random.default_rng(1)

    def frame(ttft, e2e):
        return pd.DataFrame({"arrival_s": 0.0, "first_token_s": ttft, "finished_s": e2e, "num_generated": 5})

    ttft, e2e = rng.uniform(0.1, 1.0, 80), rng.uniform(2.0, 9.0, 80)
    measured = frame(ttft, e2e)
    exact = m.sampling_error(frame(1.1 * ttft, 1.1 * e2e), measured)
    assert set(exact) == {f"{k}_{s}" for k in m.LATENCIES for s in ("mean", "p50")}
    assert max(exact.values()) < 1e-12
    noisy = m.sampling_error(frame(ttft * rng.lognormal(0, 0.2, 80), e2e), measured)["ttft_p50"]
    many = np.tile(ttft, 8)  # the same requests, eight times as many
    more = m.sampling_error(frame(many * rng.lognormal(0, 0.2, len(many)), np.tile(e2e, 8)),
                            frame(many, np.tile(e2e, 8)))["ttft_p50"]
    assert noisy > 0.01 and more < noisy / 2
