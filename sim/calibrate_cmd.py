"""`python -m sim calibrate`: fit, report in-sample and held-out errors, draw predicted vs measured.

    python -m sim calibrate --profiles profiles/vidur --plot calibration.png
    python -m sim calibrate --profiles profiles/vidur --write   # replace sim/calibration.json (the default model)
    python -m sim calibrate --worst 20   # also each held-out set's 20 worst points, operator by operator

The fitter (`sim.calibrate`) is imported when the command runs, not when the parser is built:
every `python -m sim` command builds this parser.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from .calibrated import CALIBRATION_FILE

if TYPE_CHECKING:
    from .calibrate import Report

REPO = Path(__file__).resolve().parent.parent


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="fit the calibrated cost model to Vidur profiles; in-sample and "
                                         "leave-one-out errors")
    p.add_argument("--profiles", default=str(REPO / "profiles" / "vidur"),
                   help="Vidur's <gpu>/<org>/<model>/mlp.csv tree (default: the repository's profiles/vidur)")
    p.add_argument("--plot", default=None, help="write the held-out predicted-vs-measured figure (PNG)")
    p.add_argument("--worst", type=int, default=0, metavar="N",
                   help="also print each held-out set's N worst points: the shape, and the three operators "
                        "furthest off (predicted/measured us)")
    p.add_argument("--write", action="store_true", help=f"save the constants fitted to all profiles as "
                                                        f"{CALIBRATION_FILE.name}, the default model's")


def format_report(r: Report) -> str:
    from .calibrate import GOALS, MAX_TOKENS

    lines = [f"non-attention time of one layer, 1-{MAX_TOKENS:,} tokens, every TP degree; |predicted - measured| / "
             "measured", f"fitted on: {', '.join(r.calibration.fitted_on)}"]
    if r.skipped:
        lines.append(f"skipped (model or GPU not in the catalogs): {', '.join(r.skipped)}")
    lines += ["", "GEMM constants per GPU:"]
    for gpu, g in r.calibration.gemm.items():
        lines.append(f"  {gpu:<10} compute {g.compute_efficiency:.0%} of peak, bandwidth {g.bandwidth_efficiency:.0%}, "
                     f"latency {g.latency_s * 1e6:.1f} us, p {g.sharpness:.2f}")
    lines.append("elementwise operators (all GPUs):")
    for op, e in r.calibration.elementwise.items():
        lines.append(f"  {op:<25} floor {e.floor_s * 1e6:.1f} us, {e.bytes_per_element:.2f} bytes per element")
    lines += ["", f"in-sample                      {r.in_sample}"]
    lines += [f"leave GPU out: {g:<16} {s}" for g, s in r.leave_one_gpu_out.items()]
    lines += [f"leave model out: {m:<14} {s}" for m, s in r.leave_one_architecture_out.items()]
    lines += [f"held out, all                  {r.heldout}",
              f"measured profile, interpolated {r.interpolation}  (every other profiled size held out)"]
    goals = ", ".join(f"{k} <= {v:.0%}" for k, v in GOALS.items())
    sets = {**{f"GPU {g}": s for g, s in r.leave_one_gpu_out.items()},
            **{f"model {m}": s for m, s in r.leave_one_architecture_out.items()}}
    missed = [f"{name} ({'; '.join(s.misses())})" for name, s in sets.items() if s.misses()]
    lines.append(f"goals on each held-out set ({goals}): " + (f"missed by {', '.join(missed)}" if missed else "met"))
    for name, points in r.worst.items():
        lines += ["", f"held out, {name}: worst {len(points)} (error, shape; operators predicted/measured us)"]
        lines += [f"  {p}" for p in points]
    return "\n".join(lines)


def plot_heldout(r: Report, path: str | Path) -> None:
    """Held-out predictions against measurements, in the project's figure style (`sim.plots`: a
    column wide, text of 7 points or more once printed there; 5.5 inches wide at 9-10 points, it
    printed at 5-6 points). The points are drawn first, so the +-10% lines stay visible over them."""
    import matplotlib.pyplot as plt

    from .plots import PALETTE, REFERENCE, figure, legend_below, plain_log, save

    measured, predicted = r.heldout_points
    fig, axes = figure(1, 1, height=3.0)
    ax = axes[0, 0]
    ax.plot(measured * 1e3, predicted * 1e3, ls="none", marker=".", ms=2, alpha=0.4, color=PALETTE[0],
            label="held-out point")
    lo, hi = measured.min() * 1e3, measured.max() * 1e3
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, label="predicted = measured")
    for f, label in ((1.1, "+-10%"), (1 / 1.1, None)):
        ax.plot([lo, hi], [lo * f, hi * f], **REFERENCE, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log(ax.xaxis)
    plain_log(ax.yaxis)
    ax.set_xlabel("measured (ms per layer)")
    ax.set_ylabel("predicted, held out (ms per layer)")
    ax.set_title(f"calibrated model, leave one out: median {r.heldout.median:.1%}, p90 {r.heldout.p90:.1%}, "
                 f"worst {r.heldout.worst:.1%}")
    legend_below(fig, axes)
    save(fig, path)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    from paged.output_paths import check_output_paths

    from .calibrate import calibrate
    from .plots import check_figure_format

    if args.worst < 0:
        raise ValueError(f"--worst {args.worst}: expected a count of points >= 0")
    check_output_paths([("--plot", args.plot, ".png")])  # before the fit: its minutes are not lost to a bad path
    check_figure_format("--plot", args.plot)
    report = calibrate(args.profiles, args.worst)
    print(format_report(report))
    if args.plot:
        plot_heldout(report, args.plot)
        print(f"figure: {args.plot}")
    if args.write:
        CALIBRATION_FILE.write_text(report.calibration.to_json(), encoding="utf-8")
        print(f"constants: {CALIBRATION_FILE}")
    return 0
