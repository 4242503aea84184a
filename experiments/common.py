"""What every experiment shares: its command line, where it writes and how it states a verdict
on a claim of the article.

Each experiment runs as `python experiments/NAME.py [--out DIR] [--quick]` from the repo root. It
writes NAME.csv and NAME.png (plus verdicts.txt) into DIR, by default experiments/results/NAME/
(git-ignored), and prints one verdict per claim: a claim is a hypothesis, and the verdict says
whether it held, with the numbers and the conditions. `--quick` runs a small slice (for tests):
its numbers check the plumbing, not the claims.

Figures use `sim.plots` (the demo's style: colour-blind-safe colours, a line style and marker per
system, legends outside the data), so every figure of the project looks alike. Each verdict
starts with a one-line headline: what was found, with its number.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paged.workloads.traces import AZURE_CONV, REPO
from paged.workloads.traces import TRACES_DIR as TRACES
from sim import SimConfig, Workload, get_model, load_workload, simulate

MOONCAKE = TRACES / "mooncake_fast25_synthetic_trace.jsonl"
RESULTS = REPO / "experiments" / "results"
SATURATION = math.inf  # an offered load: every request arrives at t=0
HEADLINE_CHARS = 100

def parse_args(name: str, description: str, argv: list[str] | None, add_options=None) -> argparse.Namespace:
    """--out DIR (created) and --quick, the options every experiment has, and the experiment's
    own (`add_options(parser)`), all shown by --help."""
    p = argparse.ArgumentParser(prog=f"python experiments/{name}.py", description=description)
    p.add_argument("--out", type=Path, default=RESULTS / name, help=f"output folder (default {RESULTS / name})")
    p.add_argument("--quick", action="store_true", help="a small slice, for the tests: checks plumbing, not claims")
    if add_options is not None:
        add_options(p)
    args = p.parse_args(argv)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file in the way, or no permission: before the experiment, not a traceback
        p.error(f"--out {args.out}: cannot make this folder ({e.strerror}); expected a folder path")
    return args


def write_csv(table, out: Path, stem: str) -> Path:
    path = out / f"{stem}.csv"
    table.to_csv(path, index=False, float_format="%.6g")
    return path


def write_png(fig, out: Path, stem: str) -> Path:
    """The figure, fitted to a column of a paper (`sim.plots.save`)."""
    import matplotlib.pyplot as plt

    from sim.plots import save

    path = save(fig, out / f"{stem}.png")
    plt.close(fig)
    return path


@dataclass(slots=True)
class Verdict:
    claim: str  # the article's words
    outcome: str  # "holds", "partly holds" or "does not hold"
    headline: str  # the answer in one line, with its key number
    evidence: str  # the numbers measured, and the conditions under which they were

    def __post_init__(self) -> None:
        if "\n" in self.headline or len(self.headline) > HEADLINE_CHARS:
            raise ValueError(f"Verdict.headline={self.headline!r}: expected one line of at most {HEADLINE_CHARS} "
                             "characters (the details go in the evidence)")

    def __str__(self) -> str:
        """The headline first, then the claim it answers and the details."""
        return f"[{self.outcome.upper()}] {self.headline}\n    claim: {self.claim}\n    {self.evidence}"


def report(verdicts: list[Verdict], out: Path, files: list[Path]) -> None:
    """Print the verdicts and the files written; keep the verdicts next to the figures."""
    text = "\n".join(str(v) for v in verdicts)
    (out / "verdicts.txt").write_text(text + "\n")
    print(text)
    print("wrote " + ", ".join(str(f) for f in [*files, out / "verdicts.txt"]))


def run_table_experiment(name: str, doc: str, argv: list[str] | None, table, plot, verdicts) -> int:
    """An experiment that is one table: `table(quick)` -> DataFrame, then its CSV, its figure
    (`plot(df)`), the table printed and its verdicts (`verdicts(df)`)."""
    args = parse_args(name, doc.split("\n\n")[0], argv)
    df = table(args.quick)
    files = [write_csv(df, args.out, name), write_png(plot(df), args.out, name)]
    print(df.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    report(verdicts(df), args.out, files)
    return 0


def outcome(ok: bool, partly: bool = False) -> str:
    return "holds" if ok else "partly holds" if partly else "does not hold"


def azure_conv(num_requests: int | None, model: str = "llama-2-7b") -> Workload:
    """The Azure conversation trace (first N requests), capped to the model's context as a client would."""
    return load_workload(AZURE_CONV, num_requests=num_requests, max_model_len=get_model(model).max_model_len)


def at_load(workload: Workload, qps: float) -> Workload:
    """The trace's requests with arrivals rescaled to `qps` requests per second (its burstiness kept)."""
    if qps == SATURATION:
        return workload.scale_time(1e-12)
    return workload.at_rate(qps)


def saturation_throughput(workload: Workload, config: SimConfig) -> float:
    """Requests per second `config` serves with every request queued at t=0: its capacity."""
    return simulate(at_load(workload, SATURATION), config).summary()["throughput_req_s"]


def log_x(ax, ticks, label: str) -> None:
    """A log x axis labelled at `ticks` in plain numbers (matplotlib's default 3x10^-1 labels collide)."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(label)


def percent(x: float) -> str:
    return "-" if np.isnan(x) else f"{100 * x:.0f}%"


def span(lo: float, hi: float, fmt: str = "{:.0f}") -> str:
    """"lo-hi" as a verdict writes a range, or one figure where both read the same ("75", not "75-75")."""
    a, b = fmt.format(lo), fmt.format(hi)
    return a if a == b else f"{a}-{b}"
