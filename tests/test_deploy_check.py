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
    assert set(w.prefix_index) == set(range(setup.num_groups))  # every group drawn: both cases below occur
    for i in range(len(w)):
        for j in range(len(w)):
            same_group = w.prefix_index[i] == w.prefix_index[j]
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
    assert doc["ranking"]["by"] == "ttft_s_mean" and doc["ranking"]["judged_pairs"] == 0
    router = doc["routers"]["prefix_aware"]
    # the front end's latency, measured by probes: the client's TTFT holds the engine's
    assert len(router["probe_ttft_client_s"]) == len(router["probe_ttft_engine_s"]) == dc.PROBES - 1
    assert all(c > e > 0 for c, e in zip(router["probe_ttft_client_s"], router["probe_ttft_engine_s"], strict=True))
    assert 0 < router["frontend_latency_s"] < min(router["probe_ttft_client_s"])
    assert doc["conditions"]["profile_concurrent_engines"] == dc.REPLICAS
    assert (tmp_path / "deploy_check.png").stat().st_size > 10_000
    assert "[" in (tmp_path / "verdicts.txt").read_text()


def routers_with(ttft: dict[str, tuple[float, float]]) -> dict:
    """Routers whose only metric is RANK_BY, (predicted, measured)."""
    return {r: {"metrics": {"ttft_s_mean": {"predicted": p, "measured": m, "rel_error": (p - m) / m}}}
            for r, (p, m) in ttft.items()}


def test_routers_predicted_within_the_goal_are_a_tie_the_verdict_names():
    dc = load("deploy_check")
    assert dc.RANK_BY == "ttft_s_mean"
    # a and b 5% apart (a tie), both far from c; the measurement swaps a and b only
    routers = routers_with({"a": (1.00, 1.10), "b": (1.05, 1.00), "c": (2.0, 2.2)})
    rank = dc.ranking_doc(routers)
    assert rank["predicted"] == ["a", "b", "c"] and rank["measured"] == ["b", "a", "c"] and not rank["same_order"]
    assert [(p["better"], p["worse"], p["separated"], p["agrees"]) for p in rank["pairs"]] == [
        ("a", "b", False, False), ("a", "c", True, True), ("b", "c", True, True)]
    assert rank["judged_pairs"] == 2 and rank["agree"]
    (v,) = dc.verdicts(dc.goal_rows(routers), routers)
    assert "a and b (+5.0%)" in v.evidence and "not ranked by the prediction" in v.evidence
    assert "full order differs" in v.evidence and "2 separated pairs, 1 tied" in v.headline
    # a separated pair measured the other way fails the ranking
    routers = routers_with({"a": (1.0, 2.0), "c": (2.0, 1.5)})
    rank = dc.ranking_doc(routers)
    assert rank["judged_pairs"] == 1 and not rank["agree"]
    assert "unlike measured" in dc.verdicts(dc.goal_rows(routers), routers)[0].headline
    # nothing separated: not a pass
    routers = routers_with({"a": (1.0, 1.0), "b": (1.02, 1.02)})
    assert not dc.ranking_doc(routers)["agree"]
    assert "not ranked" in dc.verdicts(dc.goal_rows(routers), routers)[0].headline

