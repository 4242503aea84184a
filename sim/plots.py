"""Figures in one consistent matplotlib style (the demo's, and the experiments')."""
from __future__ import annotations

from pathlib import Path

import numpy as np

STYLE = {
    "figure.dpi": 110, "savefig.dpi": 150, "savefig.bbox": "tight",
    "font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8,
    "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
    "lines.linewidth": 1.4,
}


def figure(nrows: int = 1, ncols: int = 1, width: float = 4.0, height: float = 3.0):
    """A figure in the project's style. Scripts without a display get matplotlib's headless
    default backend on their own; a notebook keeps its inline one."""
    import matplotlib.pyplot as plt

    plt.rcParams.update(STYLE)
    return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)


def cdf(ax, values: np.ndarray, label: str | None = None) -> None:
    v = np.sort(values[~np.isnan(values)])
    if len(v):
        ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=label)
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)


def summary_figure(result, path: str | Path | None = None):
    """TTFT, TPOT and E2E CDFs, and KV usage with running / waiting requests over time."""
    fig, axes = figure(2, 2)
    done = result.finished_mask()
    lat = result.latency_columns()
    panels = ((axes[0, 0], "ttft_s", "time to first token"), (axes[0, 1], "tpot_s", "time per output token"),
              (axes[1, 0], "e2e_s", "end-to-end latency"))
    for ax, key, title in panels:
        cdf(ax, lat[key][done])
        ax.set_xlabel("seconds")
        ax.set_title(title)
        if key != "tpot_s":
            ax.set_xscale("log")
    ax = axes[1, 1]
    ts = result.timeseries_columns
    for r in np.unique(ts["replica"]).astype(int):
        m = ts["replica"] == r
        ax.plot(ts["time_s"][m], 100 * ts["kv_usage"][m], label=f"KV usage, replica {r}" if r else "KV usage")
    ax.set_ylabel("KV blocks used (%)")
    ax.set_ylim(0, 101)
    ax.set_xlabel("simulated time (s)")
    ax.set_title("KV cache over time")
    ax2 = ax.twinx()
    m = ts["replica"] == 0
    ax2.plot(ts["time_s"][m], ts["num_running"][m], color="tab:green", alpha=0.6, lw=0.8, label="running")
    ax2.plot(ts["time_s"][m], ts["num_waiting"][m], color="tab:red", alpha=0.6, lw=0.8, label="waiting")
    ax2.set_ylabel("requests (replica 0)")
    ax2.grid(False)
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(lines, [ln.get_label() for ln in lines], loc="upper left")
    cfg = result.config
    fig.suptitle(f"{result.workload.name}: {cfg.model}, {cfg.replicas} replica(s) of {cfg.tp} x {cfg.hardware}")
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    return fig
