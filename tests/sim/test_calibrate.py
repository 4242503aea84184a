"""Fitting the calibrated model to the repository's Vidur profiles: the errors the report prints,
held against the goals of issue 12 (non-attention step time, 1-4,096 tokens, every TP degree).

One fit on everything plus five held-out fits: about 15 s on one core, so the report is computed once. The full
figures are `python -m sim calibrate`'s."""
import shutil

import numpy as np
import pytest

from sim.calibrate import ErrorStats, calibrate, fit, layer_predictions, load_datasets
from sim.calibrate_cmd import format_report, plot_heldout
from sim.calibrated import ELEMENTWISE_OPS, GEMM_OPS, default_calibration
from sim.models import get_model
from sim.vidur import find_profile, read_layer_profile

from .test_gpu_cost import PROFILES

WORST = 3  # points kept per held-out set


@pytest.fixture(scope="module")
def report():
    return calibrate(PROFILES, worst=WORST)


ARCHITECTURES = ("llama-2-7b", "llama-3-8b", "llama-2-70b+llama-3-70b")
def test_heldout_errors_meet_the_goals(report):
    """Leave one GPU out and leave one architecture out, all points together."""
    assert report.heldout.median <= 0.05
    assert report.heldout.p90 <= 0.12
    # Without Hopper's clusters of two row tiles (`HardwareSpec.cta_cluster`) 28.6%: Llama-2-70B on 8 H100s
    # just past 512 tokens.
    assert report.heldout.worst <= 0.25
    assert set(report.leave_one_gpu_out) == {"a100-80gb", "h100"}
    assert set(report.leave_one_architecture_out) == set(ARCHITECTURES)
    for stats in (*report.leave_one_gpu_out.values(), *report.leave_one_architecture_out.values()):
        assert stats.median <= 0.05


@pytest.mark.parametrize("models", ARCHITECTURES)
def test_each_heldout_model_meets_the_goals(report, models):
    """Leave one architecture out: median <= 5%, p90 <= 12%, worst <= 25% on each set (where one misses,
    `python -m sim calibrate --worst 20` shows its worst points)."""
    assert report.leave_one_architecture_out[models].misses() == []


@pytest.mark.parametrize("gpu", ("a100-80gb", "h100"))
def test_each_heldout_gpu_meets_the_goals(report, gpu):
    """Leave one GPU out, the same goals."""
    assert report.leave_one_gpu_out[gpu].misses() == []


def test_in_sample_is_better_than_the_roofline_was(report):
    """The roofline's median |error| against these profiles was 8-11%, p90 20-31%."""
    assert report.in_sample.median <= 0.04 and report.in_sample.p90 <= 0.11


def test_profile_interpolation_between_profiled_sizes(report):
    assert report.interpolation.median <= 0.02


def test_the_report_prints_these_numbers(report):
    text = format_report(report)
    for stats in (report.in_sample, report.heldout, report.interpolation):
        assert str(stats) in text
    assert f"median {report.heldout.median:6.1%}" in text
    assert "goals on each held-out set (median <= 5%, p90 <= 12%, worst <= 25%): met" in text


def test_each_heldout_sets_worst_points_are_where_its_worst_error_is(report):
    """`--worst N`'s points: each set's worst error is its first point's, operator by operator summed."""
    sets = {**{f"GPU {g}": s for g, s in report.leave_one_gpu_out.items()},
            **{f"model {m}": s for m, s in report.leave_one_architecture_out.items()}}
    assert set(report.worst) == set(sets)
    text = format_report(report)
    for name, points in report.worst.items():
        assert len(points) == WORST
        errors = [abs(p.error) for p in points]
        assert errors == sorted(errors, reverse=True)
        assert errors[0] == pytest.approx(sets[name].worst, rel=1e-9)
        assert all(set(p.measured) == set(p.predicted) == {*GEMM_OPS, *ELEMENTWISE_OPS} for p in points)
        assert f"held out, {name}: worst {WORST}" in text and all(str(p) in text for p in points)


def test_the_shipped_constants_are_the_fit_on_all_profiles(report):
    """sim/calibration.json is what `python -m sim calibrate --write` writes: reproducible."""
    shipped = default_calibration()
    assert shipped.fitted_on == report.calibration.fitted_on
    for gpu, g in report.calibration.gemm.items():
        assert shipped.gemm[gpu].compute_efficiency == pytest.approx(g.compute_efficiency, rel=1e-6)
        assert shipped.gemm[gpu].latency_s == pytest.approx(g.latency_s, rel=1e-6)


def test_a_heldout_fit_never_sees_its_gpu():
    data = load_datasets(PROFILES)
    train = [d for d in data if d.hardware != "h100"]
    cal = fit(train)
    assert "h100" not in cal.gemm and all("h100" not in name for name in cal.fitted_on)
    measured, predicted = layer_predictions(cal, [d for d in data if d.hardware == "h100"])
    assert len(measured) == 2 * 4 * 259  # two models, four TP degrees, 259 token counts
    assert ErrorStats.of(predicted / measured - 1).median < 0.06
    assert np.all(predicted > 0)


def _profile_of_shape(src, dst, model):
    """Vidur's mlp.csv at `src` with its shape columns set to `model`'s (the times kept)."""
    import csv

    m = get_model(model)
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r.update(n_head=m.num_heads, n_kv_head=m.num_kv_heads, n_embd=m.hidden_size,
                 n_expanded_embd=m.intermediate_size)
    dst.parent.mkdir(parents=True)
    with open(dst, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_every_llama_family_model_vidur_profiles_is_found_under_its_folder(tmp_path):
    """Vidur's tree holds CodeLlama-34B, InternLM2-20B (in a folder named internlm-20b) and Qwen-72B
    besides the Llama models: a tree of them calibrates them and `vidur:DIR` finds them by folder."""
    src = PROFILES / "a100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
    folders = {"codellama-34b": "codellama/CodeLlama-34b-Instruct-hf", "internlm2-20b": "internlm/internlm-20b",
               "qwen-72b": "Qwen/Qwen-72B"}
    for model, folder in folders.items():
        _profile_of_shape(src, tmp_path / "a40" / folder / "mlp.csv", model)
    data = load_datasets(tmp_path)
    assert sorted((d.model, d.hardware) for d in data) == [(m, "a40") for m in sorted(folders)]
    for model, folder in folders.items():
        assert find_profile(tmp_path, model, "a40") == tmp_path / "a40" / folder / "mlp.csv"
    cal = fit(data)
    measured, predicted = layer_predictions(cal, data)
    assert np.all(np.isfinite(predicted)) and np.all(predicted > 0) and len(predicted) == len(measured)


def test_a_profile_of_another_shape_in_a_tree_is_skipped_with_its_shape(tmp_path):
    """A tree's file whose rows are not its folder's model (here Llama-2-7B's rows in InternLM2-20B's
    folder) is skipped and named with both shapes; read on its own it is an error."""
    llama = PROFILES / "a100" / "meta-llama" / "Llama-2-7b-hf"
    shutil.copytree(llama, tmp_path / "a100" / "meta-llama" / "Llama-2-7b-hf")
    wrong = tmp_path / "a100" / "internlm" / "internlm-20b"
    shutil.copytree(llama, wrong)
    skipped = []
    assert [d.model for d in load_datasets(tmp_path, skipped)] == ["llama-2-7b"]
    assert skipped == ["a100/internlm/internlm-20b (rows of shape (n_head, n_kv_head, n_embd, n_expanded_embd) "
                       "[(32, 32, 4096, 11008)]: expected internlm2-20b's (48, 8, 6144, 16384))"]
    with pytest.raises(ValueError, match=r"internlm-20b/mlp.csv': rows of shape .*\[\(32, 32, 4096, 11008\)\]"):
        read_layer_profile(wrong / "mlp.csv", "internlm/internlm-20b")


def test_profiles_of_models_the_catalog_lacks_are_skipped_and_named(tmp_path):
    for where in ("a100/meta-llama/Llama-2-7b-hf", "a100/microsoft/phi-2", "tpu/meta-llama/Llama-2-7b-hf"):
        (tmp_path / where).mkdir(parents=True)
        shutil.copy(PROFILES / "a100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv", tmp_path / where / "mlp.csv")
    skipped = []
    data = load_datasets(tmp_path, skipped)
    assert [(d.model, d.hardware) for d in data] == [("llama-2-7b", "a100-80gb")]
    assert skipped == ["a100/microsoft/phi-2", "tpu/meta-llama/Llama-2-7b-hf"]
    with pytest.raises(FileNotFoundError, match="no <gpu>/<org>/<model>/mlp.csv profiles of a catalog model"):
        load_datasets(tmp_path / "a100" / "microsoft")


def test_the_heldout_figure_reads_at_a_column_width(report, tmp_path, monkeypatch):
    """`python -m sim calibrate --plot` drew its own 5.5-inch figure at 9-10 points: printed a
    column wide, its text came to 5-6 points. It is now in the project's style (`sim.plots`)."""
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from sim.plots import MIN_PRINTED_PT, printed_text_pt

    saved = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), savefig(fig, *a, **k))[1])
    monkeypatch.setattr(plt, "close", lambda fig=None: None)  # keep the figure to measure it
    plot_heldout(report, tmp_path / "heldout.png")
    assert saved and printed_text_pt(saved[0]) >= MIN_PRINTED_PT
