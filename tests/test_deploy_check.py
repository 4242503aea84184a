"""`experiments/deploy_check.py` closes the loop at the cluster level: profile, simulate 2 replicas
behind a router, launch the real ones (`paged launch`), replay with the load generator, compare.

A quick slice (6 requests, one router) is far too small to test accuracy, so this checks the
plumbing end to end (every request served, every metric finite on both sides, the JSON's shape) and,
exactly, the one thing both sides must agree on by construction: the workload's shared prefixes are
the same tokens for the requests of one group and different tokens across groups.
"""
import json
import math

import pytest

from .test_experiments import load

pytest.importorskip("torch")
pytest.importorskip("fastapi")


def test_the_slice_shares_real_prefix_tokens_within_a_group_only():
    dc = load("deploy_check")
    from paged.serve.prompts import PromptMaker

    setup = dc.QUICK
    w = dc.shared_prefix_slice(setup)
    assert (w.num_prompt_tokens > setup.prefix_tokens).all()
    prompts = PromptMaker(w, vocab_size=49152, min_token_id=dc.MIN_TOKEN_ID)
    heads = [tuple(prompts(i)[:setup.prefix_tokens]) for i in range(len(w))]
    for i in range(len(w)):
        for j in range(len(w)):
            same_group = i % setup.num_groups == j % setup.num_groups
            assert (heads[i] == heads[j]) == same_group, (i, j)
    assert {len(w.prefix_ids(i)) for i in range(len(w))} == {setup.prefix_tokens // dc.BLOCK_SIZE}


def test_deploy_check_quick(tmp_path):
    dc = load("deploy_check")
    assert dc.main(["--quick", "--routers", "prefix_aware", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "deploy_check.json").read_text())
    assert set(doc["routers"]) == {"prefix_aware"}
    metrics = doc["routers"]["prefix_aware"]["metrics"]
    assert {f"{k}_{q}" for k in ("ttft_s", "tpot_s", "e2e_s") for q in ("mean", "p50")} | {
        "throughput_req_s", "prefix_cache_hit_rate"} <= set(metrics)
    for name, m in metrics.items():
        assert set(m) == {"predicted", "measured", "rel_error"}, name
        assert all(isinstance(v, float) and math.isfinite(v) for v in m.values()), (name, m)
    for side in ("predicted", "measured"):
        assert 0 < metrics["prefix_cache_hit_rate"][side] < 1  # groups share prefixes; first requests miss
        assert metrics["e2e_s_mean"][side] >= metrics["ttft_s_mean"][side] > 0
    assert metrics["e2e_s_mean"]["rel_error"] == pytest.approx(
        (metrics["e2e_s_mean"]["predicted"] - metrics["e2e_s_mean"]["measured"]) / metrics["e2e_s_mean"]["measured"])
    assert doc["ranking"]["predicted"] == doc["ranking"]["measured"] == ["prefix_aware"]
    assert (tmp_path / "deploy_check.png").stat().st_size > 10_000
    assert "[" in (tmp_path / "verdicts.txt").read_text()
