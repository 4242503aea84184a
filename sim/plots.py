"""The project's one figure style (the demo's, the experiments', the notebook's), for paper use.

- Colours: Okabe & Ito's colour-blind-safe palette. Every series also has its own line style
  and marker, so a figure still reads in greyscale; `look(name)` gives a named system the same
  look in every figure ("paged" is always blue, solid, circles).
- Size: every figure fits one column of a two-column paper, `COLUMN_WIDTH_IN` (3.5 in), with
  text of 7.5-8.5 points: printed at a column's width no text is under `MIN_PRINTED_PT` (7).
  `figure(rows, cols)` stacks up to three panels in one column and lays out more two across,
  keeping the `axes[row, col]` a script asked for; `save` wraps titles and labels to their
  panel, drops the tick labels that would run into their neighbours, and warns if the figure
  still prints text too small (`SmallTextWarning`) or texts over one another
  (`OverlappingTextWarning`).
- Legends sit outside the data (`legend_below`; `legend_right` for a notebook's own figure);
  reference lines (the article's numbers, capacities, bounds) are grey and labelled, so they
  are in the legend.
- Latency distributions mark their p50 (filled circle) and p99 (open triangle): `cdf`, and
  `legend_below(..., percentiles=True)` explains the marks.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from cycler import cycler  # matplotlib's own dependency: no import of matplotlib here

COLUMN_WIDTH_IN = 3.5  # one column of a two-column paper
MIN_PRINTED_PT = 7.0  # the smallest text a figure may print at COLUMN_WIDTH_IN
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


class SmallTextWarning(UserWarning):
    """A figure that, printed at a column's width, would show text under MIN_PRINTED_PT."""


class OverlappingTextWarning(UserWarning):
    """A figure whose texts (titles, axis and tick labels, legend entries) overlap one another."""


def figure(nrows: int = 1, ncols: int = 1, height: float | None = None):
    """A figure in the project's style, one column wide: up to three panels stacked, more two
    across. `axes[r, c]` is the panel a `nrows` x `ncols` grid would have there (row by row);
    `height` is each panel's, in inches (a panel takes the column's width, or half of it).
    Scripts without a display get matplotlib's headless default backend on their own; a
    notebook keeps its inline one."""
    import matplotlib.pyplot as plt

    plt.rcParams.update(STYLE)
    n = nrows * ncols
    cols = 1 if n <= 3 else 2
    rows = -(-n // cols)
    height = height or (2.0 if cols == 1 else 2.1)
    # 0.2 in less than the column: savefig's tight bounding box pads 0.1 in on each side
    fig, grid = plt.subplots(rows, cols, figsize=(COLUMN_WIDTH_IN - 0.2, height * rows), squeeze=False)
    flat = list(grid.ravel())
    for ax in flat[n:]:
        ax.remove()
    return fig, np.array(flat[:n], dtype=object).reshape(nrows, ncols)


def _wrap(text: str, width_in: float, size_pt: float) -> str:
    """`text` broken into lines that fit `width_in` at `size_pt` (a character is about half its
    size wide); line breaks written for a wider figure are redone."""
    import textwrap

    return textwrap.fill(" ".join(text.split()), max(12, int(width_in * 72 / (0.56 * size_pt))))


def fit_to_column(fig) -> None:
    """Wrap the suptitle, every panel's title and axis labels, to the width they have."""
    if fig.get_suptitle():
        fig.suptitle(_wrap(fig.get_suptitle(), fig.get_figwidth(), STYLE["figure.titlesize"]))
    for ax in fig.axes:
        pos = ax.get_position()
        w_in, h_in = pos.width * fig.get_figwidth(), pos.height * fig.get_figheight()
        t = ax.title
        if t.get_text():
            t.set_text(_wrap(t.get_text(), w_in + 0.15, t.get_fontsize()))
        for label, size_in in ((ax.xaxis.label, w_in + 0.2), (ax.yaxis.label, h_in + 0.2)):
            if label.get_text():
                label.set_text(_wrap(label.get_text(), size_in, label.get_fontsize()))


def printed_text_pt(fig) -> float:
    """The smallest text of `fig`, in points, once the figure as saved (tight) is printed a
    column wide (or at its own size, if narrower)."""
    import matplotlib as mpl
    from matplotlib.text import Text

    fig.canvas.draw()
    width = fig.get_tightbbox(fig.canvas.get_renderer()).width + 2 * mpl.rcParams["savefig.pad_inches"]
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return min(sizes, default=MIN_PRINTED_PT) * min(1.0, COLUMN_WIDTH_IN / width)


def _tick_labels(axis, which: str) -> list:
    """The tick labels `axis` draws (shown, not blank, in view), in the order of their ticks."""
    scale = axis.get_transform().transform  # log axes compared in decades, linear ones as they are
    lo, hi = sorted(scale(np.asarray(axis.get_view_interval())))
    i = 0 if axis.axis_name == "x" else 1
    labels = [t for t in axis.get_ticklabels(which=which) if t.get_visible() and t.get_text().strip()
              and lo - 1e-9 * (hi - lo) <= scale(t.get_position()[i]) <= hi + 1e-9 * (hi - lo)]
    return sorted(labels, key=lambda t: t.get_position()[i])


def _texts(fig) -> list:
    """Every text `fig` draws: titles, axis labels, tick labels in view, legend entries, free text."""
    from matplotlib.text import Text

    texts = [*fig.texts, *(t for lg in fig.legends for t in lg.get_texts())]
    for ax in fig.axes:
        texts += [ax.title, *ax.texts]
        texts += ax.get_legend().get_texts() if ax.get_legend() else []
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_visible():
                texts += [axis.label, axis.offsetText, *_tick_labels(axis, "both")]
    return [t for t in dict.fromkeys(texts) if isinstance(t, Text) and t.get_visible() and t.get_text().strip()]


def thin_tick_labels(fig) -> None:
    """Hide the tick labels that would run into another on their axis ("0.250.5" on a half-column
    log axis, "816 32" of 2-256): the major labels are kept from the first on whenever they clear
    the ones kept by a quarter of their size across, then the minor ones that clear them all so."""
    from matplotlib.transforms import Bbox

    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            kept = []
            for which in ("major", "minor"):
                for label in _tick_labels(axis, which):
                    pad = label.get_fontsize() / 4 * fig.dpi / 72
                    b = label.get_window_extent(renderer)
                    box = Bbox.from_extents(b.x0 - pad, b.y0, b.x1 + pad, b.y1)  # a line's height spaces it already
                    if any(box.overlaps(k) for k in kept):
                        label.set_visible(False)
                    else:
                        kept.append(b)


def overlapping_texts(fig) -> list[tuple[str, str]]:
    """The pairs of texts of `fig`, as drawn, whose boxes overlap by more than a pixel each way
    (texts turned by other than a right angle are left out: their boxes are not their ink)."""
    import itertools

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in _texts(fig) if t.get_rotation() % 90 == 0]
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2)
            if min(ba.x1, bb.x1) - max(ba.x0, bb.x0) > 1 and min(ba.y1, bb.y1) - max(ba.y0, bb.y0) > 1]


def check_figure_format(option: str, value: str | None) -> None:
    """A figure's suffix names a format matplotlib writes (no suffix: matplotlib's default, PNG)."""
    if not value or not Path(value).suffix:
        return
    from matplotlib.figure import Figure

    suffix = Path(value).suffix
    formats = Figure().canvas.get_supported_filetypes()
    if suffix[1:].lower() not in formats:
        raise ValueError(f"{option} {value}: matplotlib cannot write {suffix} files; expected one of "
                         f"{sorted(formats)}")


def save(fig, path: str | Path) -> Path:
    """Fit `fig` to a column and write it; warn if its text would print under MIN_PRINTED_PT or
    if texts overlap."""
    import warnings

    fit_to_column(fig)
    fig.tight_layout()
    fig.canvas.draw()
    thin_tick_labels(fig)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    pt = printed_text_pt(fig)
    if pt < MIN_PRINTED_PT - 1e-9:
        warnings.warn(f"{path}: printed a column ({COLUMN_WIDTH_IN} in) wide, its smallest text would be "
                      f"{pt:.2f} pt; expected at least {MIN_PRINTED_PT:g}", SmallTextWarning, stacklevel=2)
    overlaps = overlapping_texts(fig)
    if overlaps:
        warnings.warn(f"{path}: texts overlap ({len(overlaps)} pairs), e.g. "
                      + "; ".join(f"{a!r} and {b!r}" for a, b in overlaps[:3]), OverlappingTextWarning, stacklevel=2)
    return path


def plain_log(axis) -> None:
    """Label a log axis (`ax.yaxis`, `ax.xaxis`) in plain numbers, 0.6 and 20, not 6 x 10^-1 and
    2 x 10^1, at every power of ten (matplotlib's own pick, every third on a half-column panel,
    left 0.01 and 10 alone on four decades; `save` drops those that do not fit); minor ticks get
    labels where matplotlib's log formatter would give them."""
    from matplotlib.ticker import LogFormatter, LogLocator

    class Plain(LogFormatter):
        def _num_to_string(self, x, vmin, vmax):
            return f"{x:g}"

    axis.set_major_locator(LogLocator(numticks=12))
    axis.set_major_formatter(Plain())
    axis.set_minor_formatter(Plain(labelOnlyBase=False, minor_thresholds=(1, 0.5)))


def _percentile_handles():
    from matplotlib.lines import Line2D

    return [Line2D([], [], ls="none", **P50, mfc="0.3", label="p50"),
            Line2D([], [], ls="none", **P99, mec="0.3", label="p99")]


def cdf(ax, values: np.ndarray, label: str | None = None, percentiles: bool = True, **kwargs) -> None:
    """The empirical CDF of `values` (NaNs dropped), with its p50 and p99 marked in its colour."""
    v = np.sort(values[~np.isnan(values)])
    if len(v) and np.ptp(v) <= 1e-9 * np.abs(v).max():
        v = np.full_like(v, v[0])  # one value up to rounding: not an axis 1e-11 wide, labelled "1e-11+1.14e1"
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


def legend_below(fig, axes, ncol: int | None = None, percentiles: bool = False, extra=()) -> None:
    """One legend for the whole figure, under its panels (outside every axis), in as many
    columns (at most `ncol`) as its longest label lets fit a column's width; `extra` handles
    (a key to marks in the panels) come last."""
    handles = _handles(axes, (*(_percentile_handles() if percentiles else ()), *extra))
    longest = max((len(h.get_label()) for h in handles), default=1)
    fits = max(1, int(COLUMN_WIDTH_IN * 72 / (0.5 * STYLE["legend.fontsize"] * longest + 30)))
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(ncol or 4, len(handles), fits))


def legend_right(ax, percentiles: bool = False, **kwargs) -> None:
    """A panel's own legend, to its right (outside the data): for a figure of its own in a
    notebook; a paper's figures take `legend_below`, which keeps them a column wide."""
    ax.legend(handles=_handles([ax], _percentile_handles() if percentiles else ()), loc="upper left",
              bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kwargs)


def summary_figure(result, path: str | Path | None = None):
    """Three panels, one column: the TTFT and E2E CDFs (one log axis of seconds), the TPOT CDF
    (ms), each with its p50 and p99 marked; KV usage over time, each replica in its own look,
    with replica 0's running and waiting requests."""
    fig, axes = figure(3, 1)
    done = result.finished_mask()
    lat = result.latency_columns()
    ax = axes[0, 0]
    # latencies in the palette's last looks, replicas (below) in its first: no two series share one
    for i, (key, label) in ((6, ("ttft_s", "time to first token")), (4, ("e2e_s", "end-to-end latency"))):
        cdf(ax, lat[key][done], label=label, **look(i))
    ax.set_xscale("log")
    plain_log(ax.xaxis)
    ax.set(xlabel="seconds", title="latency per request")
    ax = axes[1, 0]
    cdf(ax, 1e3 * lat["tpot_s"][done], label="time per output token", **look(5))
    ax.set(xlabel="ms", title="time per output token (first to last token)")
    ax = axes[2, 0]
    ts = result.timeseries_columns
    replicas = np.unique(ts["replica"]).astype(int)
    for r in replicas:
        m = ts["replica"] == r
        ax.plot(ts["time_s"][m], 100 * ts["kv_usage"][m], label=f"KV used, replica {r}" if len(replicas) > 1
                else "KV blocks used", **{**look(int(r)), "marker": "none"})
    ax.set_ylabel("KV blocks used (%)")
    ax.set_ylim(0, 101)
    ax.set_xlabel("simulated time (s)")
    ax.set_title("KV cache and queue" + (" (requests: replica 0)" if len(replicas) > 1 else ""))
    ax2 = ax.twinx()
    m = ts["replica"] == 0
    ax2.plot(ts["time_s"][m], ts["num_running"][m], color="0.35", ls=":", lw=0.9, label="running requests")
    ax2.plot(ts["time_s"][m], ts["num_waiting"][m], color="0.6", ls="-.", lw=0.9, label="waiting requests")
    ax2.set_ylabel("requests")
    # whole requests, counted from the KV axis' 0: no "2.5 requests", no waiting line floating at 5%
    ax2.set_ylim(bottom=0)
    ax2.yaxis.get_major_locator().set_params(integer=True)
    ax2.grid(False)
    ax2.spines["right"].set_visible(True)
    legend_below(fig, fig.axes, percentiles=True)
    cfg = result.config
    fig.suptitle(f"{result.workload.name}: {cfg.model}, {cfg.replicas} replica(s) of {cfg.tp} x {cfg.hardware}")
    if path is not None:
        save(fig, path)
    return fig
