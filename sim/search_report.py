"""What a config search shows: the table of deployments, and the Pareto figure of throughput
against cost (the deployments no other beats on both)."""
from __future__ import annotations

import math

COLUMNS = (("deployment", "{}"), ("gpus", "{:d}"), ("max_qps", "{:.3g}"), ("qps_per_gpu", "{:.3g}"),
           ("usd_per_hour", "{:.2f}"), ("qps_per_usd_hour", "{:.3g}"))


def deployment_name(row) -> str:
    return (f"{row['hardware']} tp{row['tp']} x{row['replicas']} {row['router']} "
            f"seqs{row['max_num_seqs']}")


def point_label(row, df) -> str:
    """A deployment's name in the figure: without the router or max_num_seqs when every
    deployment has the same (the table names them): labels short enough to stay in the panel."""
    varies = {k: df[k].nunique() > 1 for k in ("router", "max_num_seqs")}
    return " ".join([f"{row['hardware']} tp{row['tp']} x{row['replicas']}",
                     *([row["router"]] if varies["router"] else []),
                     *([f"seqs{row['max_num_seqs']}"] if varies["max_num_seqs"] else [])])


def infeasible_notes(df) -> list[str]:
    """One line per reason a deployment cannot be built at all (its table cell only says "not
    valid"), for the lines before the table: short of memory is "does not fit" in the table."""
    invalid = df[df.infeasible == "not valid"] if "infeasible" in df else df.iloc[:0]
    counts = invalid.reason.value_counts(sort=False)
    return [f"not valid ({n} deployment{'s' * (n > 1)}): {reason}" for reason, n in counts.items()]


def format_table(df) -> str:
    """One aligned line per deployment; infeasible ones say why, in short (`infeasible_notes`: in full)."""
    lines = []
    for _, row in df.iterrows():
        cells = {"deployment": deployment_name(row)}
        for name, fmt in COLUMNS[1:]:
            v = row[name]
            cells[name] = "-" if isinstance(v, float) and math.isnan(v) else fmt.format(v)
        if not row["feasible"]:
            cells["max_qps"] = row["infeasible"]
        lines.append(cells)
    widths = {n: max(len(n), *(len(c[n]) for c in lines)) for n, _ in COLUMNS}
    head = "  ".join(n.ljust(widths[n]) if n == "deployment" else n.rjust(widths[n]) for n, _ in COLUMNS)
    body = ["  ".join(c[n].ljust(widths[n]) if n == "deployment" else c[n].rjust(widths[n]) for n, _ in COLUMNS)
            for c in lines]
    return "\n".join([head, *body])


def pareto_front(costs, values) -> list[int]:
    """Indices of the points no other point beats: lower or equal cost and higher value, or lower
    cost and equal value. Points with a NaN are never on it."""
    pts = [(c, v, i) for i, (c, v) in enumerate(zip(costs, values, strict=True))
           if not (math.isnan(c) or math.isnan(v))]
    front, best = [], -math.inf
    for _, v, i in sorted(pts, key=lambda p: (p[0], -p[1])):
        if v > best:
            front.append(i)
            best = v
    return front


# Where a front point's number goes, in points from it, tried in turn: the front rises to the
# right, so above-left and below-right are off its line; further out when close points took those.
NUMBER_OFFSETS = tuple((sx * d, sy * d) for d in (3, 9, 15) for sx, sy in ((-1, 1), (1, -1), (1, 1), (-1, -1)))


def place_number(ax, text: str, xy, placed: list):
    """Annotate `xy` with `text` at the first of NUMBER_OFFSETS where it overlaps none of the
    window extents in `placed` (else the last); returns its extent."""
    renderer = ax.figure.canvas.get_renderer()
    for dx, dy in NUMBER_OFFSETS:
        note = ax.annotate(text, xy, fontsize=7, xytext=(dx, dy), textcoords="offset points",
                           ha="right" if dx < 0 else "left", va="bottom" if dy > 0 else "top")
        box = note.get_window_extent(renderer)
        if (dx, dy) == NUMBER_OFFSETS[-1] or not any(box.overlaps(b) for b in placed):
            return box
        note.remove()


def pareto_figure(df, path=None):
    """Max QPS against dollars per hour (GPUs when no prices are known), the front drawn. The
    front's points are numbered in order of cost and named in the key under the panel: names
    written beside the points ran into each other and into the legend wherever two deployments
    cost about the same."""
    from matplotlib.lines import Line2D

    from .plots import figure, legend_below, look, save

    priced = df.usd_per_hour.notna().any()
    x = df.usd_per_hour if priced else df.gpus.astype(float)
    fig, axes = figure(1, 1, height=2.6)
    ax = axes[0, 0]
    ok = df.feasible.astype(bool)
    for i, (hw, d) in enumerate(df[ok].groupby("hardware")):  # a marker each: apart in greyscale too
        ax.scatter(x[d.index], d.max_qps, s=14, label=hw, color=look(i)["color"], marker=look(i)["marker"])
    front = pareto_front(x[ok].tolist(), df.max_qps[ok].tolist())
    idx = [df[ok].index[i] for i in front]
    ax.plot(x[idx], df.max_qps[idx], color="black", lw=0.8, ls="--", label="Pareto front")
    ax.set_xlabel("cost (USD per hour)" if priced else "GPUs")
    ax.set_ylabel("max QPS within the SLOs")
    ax.set_title("deployments: throughput within SLOs against cost")
    ax.margins(x=0.08, y=0.1)  # room for the first point's number
    fig.tight_layout()  # the panel's final place, near enough: the numbers are placed where they will print
    names, placed = [], []
    for n, i in enumerate(idx, 1):
        placed.append(place_number(ax, str(n), (x[i], df.max_qps[i]), placed))
        names.append(Line2D([], [], ls="none", marker=f"${n}$", ms=5, color="black",
                            label=f"{point_label(df.loc[i], df)}: {df.max_qps[i]:.3g} QPS"))
    legend_below(fig, axes, ncol=1, extra=names)
    if path is not None:
        save(fig, path)
    return fig
