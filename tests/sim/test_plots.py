"""The shared figure style: series that read apart in greyscale, legends outside the data,
p50/p99 marked on latency distributions."""
import numpy as np

from sim import SimConfig, Workload, simulate
from sim.plots import LINESTYLES, LOOKS, MARKERS, PALETTE, summary_figure


def test_every_look_differs_in_colour_line_style_and_marker():
    """Greyscale loses the colour: the line style and the marker must still tell series apart."""
    for values in (PALETTE, LINESTYLES, MARKERS):
        assert len({str(v) for v in values}) == len(values) == len(PALETTE)
    assert max(LOOKS.values()) < len(PALETTE)


def test_the_summary_figure_keeps_replicas_apart_and_its_legend_off_the_data():
    w = Workload(np.linspace(0, 20, 80), np.full(80, 300), np.full(80, 60))
    fig = summary_figure(simulate(w, SimConfig(replicas=4, timeseries_interval_s=0.5)))
    kv = fig.axes[2]
    looks = {(ln.get_color(), str(ln.get_linestyle())) for ln in kv.get_lines()}
    assert len(looks) == 4  # one per replica
    assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"p50", "p99", "running requests", "KV used, replica 3"} <= set(labels)
    for ax in fig.axes[:2]:  # TTFT and E2E; TPOT
        marks = [ln for ln in ax.get_lines() if ln.get_linestyle() == "None"]
        assert [m.get_ydata()[0] for m in marks] == [0.5, 0.99] * (len(marks) // 2) and marks  # p50, p99


def test_every_figure_reads_at_a_column_width(tmp_path):
    """Printed 3.5 inches wide, no text of the summary, search or breakdown figure is under 7
    points (the experiments' figures: tests/test_experiments.py)."""
    import warnings

    import pandas as pd

    from sim.breakdown import breakdowns, plot
    from sim.plots import MIN_PRINTED_PT, SmallTextWarning, printed_text_pt
    from sim.search_report import pareto_figure

    w = Workload(np.linspace(0, 20, 80), np.full(80, 300), np.full(80, 60))
    assert printed_text_pt(summary_figure(simulate(w, SimConfig(replicas=4)), tmp_path / "s.png")) >= MIN_PRINTED_PT
    df = pd.DataFrame({"hardware": ["a100-80gb", "h100", "h100"], "tp": [1, 1, 2], "replicas": [1, 1, 1],
                       "router": ["round_robin"] * 3, "max_num_seqs": [256] * 3, "gpus": [1, 1, 2],
                       "usd_per_hour": [2.0, 3.0, 6.0], "max_qps": [3.0, 5.0, 8.0], "feasible": [True] * 3})
    assert printed_text_pt(pareto_figure(df, tmp_path / "p.png")) >= MIN_PRINTED_PT
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallTextWarning)
        plot(breakdowns("llama-2-7b", "a100-80gb", 1, "calibrated", 1024), "llama-2-7b", tmp_path / "b.png")


def test_the_readmes_search_figure_reads_at_a_column_width(tmp_path):
    """The README's search (a100-80gb,h100 x tp 1,2 x replicas 1,2,4, one router): its front's
    seven labels, named in full, ran past the panel: its text printed under 7 points (6.98 on the real search)."""
    import itertools
    import warnings

    import pandas as pd

    from sim.plots import OverlappingTextWarning, SmallTextWarning
    from sim.search_report import pareto_figure

    price, qps_per_gpu = {"a100-80gb": 5.12, "h100": 12.29}, {"a100-80gb": 4.6, "h100": 10.5}
    rows = [{"hardware": hw, "tp": tp, "replicas": r, "router": "round_robin", "max_num_seqs": 256, "gpus": tp * r,
             "usd_per_hour": price[hw] * tp * r, "max_qps": qps_per_gpu[hw] * tp * r * (1 + 0.02 * tp * r),
             "feasible": True} for hw, tp, r in itertools.product(price, (1, 2), (1, 2, 4))]
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallTextWarning)
        warnings.simplefilter("error", OverlappingTextWarning)
        pareto_figure(pd.DataFrame(rows), tmp_path / "pareto.png")


def test_the_small_text_warning_does_not_round_its_size_up_to_the_limit(tmp_path):
    """6.96 points read "7.0 pt; expected at least 7": a warning that seemed to contradict itself."""
    import matplotlib.pyplot as plt
    import pytest

    from sim.plots import SmallTextWarning, save

    fig = plt.figure(figsize=(3.0, 1.0))
    fig.text(0.5, 0.5, "small", fontsize=6.96)
    with pytest.warns(SmallTextWarning, match=r"would be 6\.96 pt; expected at least 7$"):
        save(fig, tmp_path / "f.png")
    plt.close(fig)


def test_the_search_figure_names_its_front_without_overlaps(tmp_path):
    """The search's Pareto figure named each point of its front beside it: where two deployments
    cost about the same (h100 tp2 x1 and a100-80gb tp2 x2 in the README's search) the names ran into
    each other, and the legend inside the panel covered another. Now the points are numbered and
    the key sits under the panel: no two texts of the figure overlap, and the legend is off the panel."""
    import itertools

    import pandas as pd

    from sim.search_report import pareto_figure

    price, qps_per_gpu = {"a100-80gb": 5.12, "h100": 12.29}, {"a100-80gb": 4.6, "h100": 10.2}
    rows = [{"hardware": hw, "tp": tp, "replicas": r, "router": router, "max_num_seqs": seqs, "gpus": tp * r,
             "usd_per_hour": price[hw] * tp * r, "feasible": True,
             "max_qps": qps_per_gpu[hw] * tp * r * (1 + 0.02 * tp * r) * (1 + 0.1 * (seqs == 256))}
            for hw, tp, r, router, seqs in itertools.product(price, (1, 2), (1, 2, 4),
                                                             ("round_robin", "least_outstanding"), (128, 256))]
    fig = pareto_figure(pd.DataFrame(rows), tmp_path / "pareto.png")
    renderer = fig.canvas.get_renderer()
    ax, = fig.axes
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(boxes) >= 5  # one number per point of the front
    assert not [(a, b) for a, b in itertools.combinations(boxes, 2) if a.overlaps(b)]
    legend = (fig.legends or [ax.get_legend()])[0].get_window_extent(renderer)
    assert not legend.overlaps(ax.get_window_extent(renderer))
    assert not [b for b in boxes if b.overlaps(legend)]


def test_tick_labels_that_would_run_together_are_thinned(tmp_path):
    """Batch sizes 2-256 on a half-column log axis printed "816 32", and 0.25-8 req/s "0.250.5"
    (static_vs_paged, batching_knobs): `save` keeps the first label and each that clears it."""
    from sim.plots import STYLE, figure, save

    fig, axes = figure(2, 2)
    for ax, ticks in zip(axes.ravel(), ([2, 4, 8, 16, 32, 256], [0.25, 0.5, 1, 2, 4, 8], [1, 2], [1, 2]), strict=True):
        ax.plot([ticks[0], ticks[-1]], [0, 1])
        ax.set_xscale("log")
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    save(fig, tmp_path / "f.png")
    renderer = fig.canvas.get_renderer()
    space = STYLE["xtick.labelsize"] / 4 * fig.dpi / 72  # a quarter of their size between two labels
    for ax in axes.ravel()[:2]:
        shown = [t for t in ax.get_xticklabels() if t.get_visible()]
        assert shown[0].get_text() in ("2", "0.25") and len(shown) >= 4
        boxes = sorted((t.get_window_extent(renderer) for t in shown), key=lambda b: b.x0)
        assert all(a.x1 + space <= b.x0 for a, b in zip(boxes, boxes[1:]))


def test_texts_over_one_another_are_reported(tmp_path):
    """The size check missed text written over text: `save` warns of it too."""
    import matplotlib.pyplot as plt
    import pytest

    from sim.plots import OverlappingTextWarning, save

    fig = plt.figure(figsize=(3.0, 1.0))
    fig.text(0.3, 0.5, "a label")
    fig.text(0.35, 0.5, "another")
    with pytest.warns(OverlappingTextWarning, match="'a label' and 'another'"):
        save(fig, tmp_path / "f.png")
    plt.close(fig)


def test_equal_latencies_up_to_rounding_get_a_plain_axis(tmp_path):
    """Requests all alike take the same TPOT, up to 1e-11 ms of rounding: the CDF's axis spanned that
    and matplotlib labelled it with an offset ("1e-11+1.137973716e1") written over the axis label."""
    import warnings

    from sim.plots import OverlappingTextWarning

    w = Workload(np.linspace(0, 20, 80), np.full(80, 300), np.full(80, 60))
    with warnings.catch_warnings():
        warnings.simplefilter("error", OverlappingTextWarning)
        fig = summary_figure(simulate(w, SimConfig(replicas=4)), tmp_path / "s.png")
    assert fig.axes[1].xaxis.get_offset_text().get_text() == ""


def test_a_log_axis_is_labelled_at_every_decade_that_fits(tmp_path):
    """Four decades of TTFT on a half-column panel read "0.01" and "10" alone (matplotlib labels
    every third decade there); nine decades must not count labels outside the view as overlaps."""
    import warnings

    from sim.plots import OverlappingTextWarning, figure, plain_log, save

    fig, axes = figure(2, 2)
    for ax, (lo, hi) in zip(axes.ravel(), ((0.01, 30), (1, 1e9), (1, 2), (1, 2)), strict=True):
        ax.plot([lo, hi], [lo, hi])
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain_log(ax.xaxis)
        plain_log(ax.yaxis)
    with warnings.catch_warnings():
        warnings.simplefilter("error", OverlappingTextWarning)
        save(fig, tmp_path / "f.png")
    lo, hi = axes[0, 0].get_xlim()
    shown = [t.get_text() for t in axes[0, 0].get_xticklabels() if t.get_visible() and lo <= t.get_position()[0] <= hi]
    assert shown == ["0.01", "0.1", "1", "10"]
