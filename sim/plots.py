"""The project's one figure style (the demo's, the experiments', the notebook's), for paper use.

- Colours: Okabe & Ito's colour-blind-safe palette. Every series also has its own line style
  and marker, so a figure still reads in greyscale; `look(name)` gives a named system the same
  look in every figure ("paged" is always blue, solid, circles).
- Size: 8-point text, and panels of 2.3 x 2.1 inches (up to 3.0 x 2.3 for two across), so that
  no figure is wider than `MAX_WIDTH_IN`, a page's text width: printed at that width (a figure*
  in a two-column paper) its text stays 8 points; one panel fits a column.
- Legends sit outside the data (`legend_below`, `legend_right`); reference lines (the
  article's numbers, capacities, bounds) are grey and labelled, so they are in the legend.
- Latency distributions mark their p50 (filled circle) and p99 (open triangle): `cdf`, with
  `PERCENTILE_HANDLES` for the legend.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from cycler import cycler  # matplotlib's own dependency: no import of matplotlib here

MAX_WIDTH_IN = 7.25  # a page's text width, with the labels and legends outside the panels
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#E69F00", "#CC79A7", "#56B4E9", "#000000")  # Okabe & Ito
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 1)))
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
REFERENCE = {"color": "0.45", "lw": 0.9, "ls": (0, (4, 2))}  # the article's numbers, capacities, bounds
BAND = {"color": "0.88", "lw": 0}  # a reference range (axhspan / axvspan)
P50 = {"marker": "o", "ms": 5, "mec": "black", "mew": 0.6}  # a distribution's median, filled in its colour
P99 = {"marker": "^", "ms": 5.5, "mfc": "white", "mew": 1.2}  # its p99, open, edged in its colour

# One look per system, the same in every figure: an index into the palette, styles and markers.
LOOKS = {"paged": 0, "static": 1, "static (max_model_len)": 1, "static (max_tokens)": 3,
         "with prefix caching": 0, "without prefix caching": 1, "predicted": 0, "measured": 1,
         "priority + preemption": 0, "fcfs": 1, "priority, no preemption": 2}


STYLE = {
    # markers only where asked for (look()): dense lines have none
    "axes.prop_cycle": cycler(color=PALETTE, linestyle=LINESTYLES),
    "figure.dpi": 110, "savefig.dpi": 200, "savefig.bbox": "tight",
    "font.size": 8, "axes.titlesize": 8.5, "axes.labelsize": 8, "legend.fontsize": 7.5, "xtick.labelsize": 7.5,
    "ytick.labelsize": 7.5, "figure.titlesize": 9,
    "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
    "lines.linewidth": 1.3, "lines.markersize": 3.5, "legend.frameon": False, "errorbar.capsize": 2.5,
}


def look(series: str | int) -> dict:
    """Colour, line style and marker of a named system (`LOOKS`) or of the i-th series."""
    i = LOOKS[series] if isinstance(series, str) else series % len(PALETTE)
    return {"color": PALETTE[i], "ls": LINESTYLES[i], "marker": MARKERS[i]}


def figure(nrows: int = 1, ncols: int = 1, width: float = 2.3, height: float = 2.1):
    """A figure in the project's style. Scripts without a display get matplotlib's headless
    default backend on their own; a notebook keeps its inline one."""
    import matplotlib.pyplot as plt

    plt.rcParams.update(STYLE)
    return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)


def plain_log(axis) -> None:
    """Label a log axis (`ax.yaxis`, `ax.xaxis`) in plain numbers, 0.6 and 20, not 6 x 10^-1 and
    2 x 10^1; minor ticks get labels where matplotlib's log formatter would give them."""
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):
        def _num_to_string(self, x, vmin, vmax):
            return f"{x:g}"

    axis.set_major_formatter(Plain())
    axis.set_minor_formatter(Plain(labelOnlyBase=False, minor_thresholds=(1, 0.5)))


def _percentile_handles():
    from matplotlib.lines import Line2D

    return [Line2D([], [], ls="none", **P50, mfc="0.3", label="p50"),
            Line2D([], [], ls="none", **P99, mec="0.3", label="p99")]


def cdf(ax, values: np.ndarray, label: str | None = None, percentiles: bool = True, **kwargs) -> None:
    """The empirical CDF of `values` (NaNs dropped), with its p50 and p99 marked in its colour."""
    v = np.sort(values[~np.isnan(values)])
    if len(v):
        (line,) = ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=label, **{**kwargs, "marker": "none"})
        if percentiles:
            p50, p99 = np.percentile(v, [50, 99])
            ax.plot([p50], [0.5], ls="none", **P50, mfc=line.get_color(), zorder=3)
            ax.plot([p99], [0.99], ls="none", **P99, mec=line.get_color(), zorder=3)
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)


def _handles(axes, extra=()):
    """Every labelled artist of `axes` once (by label), then `extra`."""
    seen, handles = set(), []
    for ax in np.ravel(axes):
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in seen:
                seen.add(label)
                handles.append(h)
    return handles + [h for h in extra if h.get_label() not in seen]


def legend_below(fig, axes, ncol: int | None = None, percentiles: bool = False) -> None:
    """One legend for the whole figure, under its panels (outside every axis)."""
    handles = _handles(axes, _percentile_handles() if percentiles else ())
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=ncol or min(len(handles), 4))


def legend_right(ax, percentiles: bool = False, **kwargs) -> None:
    """A panel's own legend, to its right (outside the data)."""
    ax.legend(handles=_handles([ax], _percentile_handles() if percentiles else ()), loc="upper left",
              bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kwargs)


def summary_figure(result, path: str | Path | None = None):
    """TTFT, TPOT and E2E CDFs (p50 and p99 marked), and KV usage with running / waiting
    requests over time, each replica in its own look."""
    fig, axes = figure(2, 2, width=3.0, height=2.3)
    done = result.finished_mask()
    lat = result.latency_columns()
    panels = ((axes[0, 0], "ttft_s", "time to first token"),
              (axes[0, 1], "tpot_s", "time per output token (mean per request)"),
              (axes[1, 0], "e2e_s", "end-to-end latency"))
    for ax, key, title in panels:
        cdf(ax, lat[key][done], **look(0))
        ax.set_xlabel("seconds")
        ax.set_title(title)
        if key != "tpot_s":
            ax.set_xscale("log")
    ax = axes[1, 1]
    ts = result.timeseries_columns
    replicas = np.unique(ts["replica"]).astype(int)
    for r in replicas:
        m = ts["replica"] == r
        ax.plot(ts["time_s"][m], 100 * ts["kv_usage"][m], label=f"KV used, replica {r}" if len(replicas) > 1
                else "KV blocks used", **{**look(int(r)), "marker": "none"})
    ax.set_ylabel("KV blocks used (%)")
    ax.set_ylim(0, 101)
    ax.set_xlabel("simulated time (s)")
    ax.set_title("KV cache over time" + (" (requests: replica 0)" if len(replicas) > 1 else ""))
    ax2 = ax.twinx()
    m = ts["replica"] == 0
    ax2.plot(ts["time_s"][m], ts["num_running"][m], color="0.35", ls=":", lw=0.9, label="running requests")
    ax2.plot(ts["time_s"][m], ts["num_waiting"][m], color="0.6", ls="-.", lw=0.9, label="waiting requests")
    ax2.set_ylabel("requests")
    ax2.grid(False)
    ax2.spines["right"].set_visible(True)
    legend_below(fig, fig.axes, percentiles=True)
    cfg = result.config
    fig.suptitle(f"{result.workload.name}: {cfg.model}, {cfg.replicas} replica(s) of {cfg.tp} x {cfg.hardware}")
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    return fig
