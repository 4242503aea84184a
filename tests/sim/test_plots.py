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
    kv = fig.axes[3]
    looks = {(ln.get_color(), str(ln.get_linestyle())) for ln in kv.get_lines()}
    assert len(looks) == 4  # one per replica
    assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"p50", "p99", "running requests", "KV used, replica 3"} <= set(labels)
    ttft = fig.axes[0]
    marks = [ln for ln in ttft.get_lines() if ln.get_linestyle() == "None"]
    assert [m.get_ydata()[0] for m in marks] == [0.5, 0.99]  # p50, p99 on the CDF
