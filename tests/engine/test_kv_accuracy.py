"""The agreement measures of paged.engine.kv_accuracy, on hand-made outputs."""
import pytest

from paged.engine import kv_accuracy


def test_compare_counts_prefixes_positions_and_first_divergences():
    reference = [[1, 2, 3, 4], [5, 6], [7, 8, 9, 10]]
    outputs = [[1, 2, 3, 4], [5, 0], [0, 8, 9]]
    r = kv_accuracy.compare(reference, outputs)
    assert r["identical"] == pytest.approx(1 / 3)
    assert r["prefix_match"] == pytest.approx((1 + 1 / 2 + 0) / 3)
    assert r["token_match"] == pytest.approx((4 + 1 + 2) / 10)
    assert (r["first_divergence_median"], r["first_divergence_min"]) == (0.5, 0)
    assert kv_accuracy.compare(reference, reference)["first_divergence_median"] is None


def test_prompts_are_distinct_and_bounded():
    assert len(set(kv_accuracy.prompts(64))) == 64
    with pytest.raises(ValueError, match="at most 64"):
        kv_accuracy.prompts(65)
