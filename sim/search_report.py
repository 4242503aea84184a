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


def format_table(df) -> str:
    """One aligned line per deployment; infeasible ones say why."""
    lines = []
    for _, row in df.iterrows():
        cells = {"deployment": deployment_name(row)}
        for name, fmt in COLUMNS[1:]:
            v = row[name]
            cells[name] = "-" if isinstance(v, float) and math.isnan(v) else fmt.format(v)
        if not row["feasible"]:
            cells["max_qps"] = "does not fit"
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


def pareto_figure(df, path=None):
    """Max QPS against dollars per hour (GPUs when no prices are known), the front drawn."""
    from .plots import figure, look, save

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
    mid = (x[ok].min() + x[ok].max()) / 2
    for i in idx:  # each name on the side of its point towards the middle: inside the panel
        right = x[i] > mid
        ax.annotate(point_label(df.loc[i], df), (x[i], df.max_qps[i]), fontsize=7, xytext=(-3 if right else 3, -8),
                    textcoords="offset points", ha="right" if right else "left")
    ax.set_xlabel("cost (USD per hour)" if priced else "GPUs")
    ax.set_ylabel("max QPS within the SLOs")
    ax.set_title("deployments: throughput within SLOs against cost")
    ax.legend()
    if path is not None:
        save(fig, path)
    return fig
