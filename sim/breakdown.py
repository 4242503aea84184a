"""`python -m sim breakdown`: where a step's time goes, for decode batches and prefill chunks.

    python -m sim breakdown --model llama-2-7b --hardware a100-80gb --plot breakdown.png

Each bar is one step (`sim.step_breakdown`): decodes of `--context` tokens each at a few batch
sizes, then single fresh prompts of a few lengths; stacked by part, as the simulator charges it.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .gpu_cost import gpu_cost_model, step_breakdown
from .step_cost import BREAKDOWN_KEYS

DECODE_BATCHES = (1, 8, 32, 128, 256)
PREFILL_CHUNKS = (128, 512, 2048)


def add_parser(sub) -> None:
    p = sub.add_parser("breakdown", help="where a step's time goes (non-attention, attention, LM head, ...)")
    p.add_argument("--model", default="llama-2-7b", help="model spec (python -m sim list names them)")
    p.add_argument("--hardware", default="a100-80gb", help="GPU spec")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs")
    p.add_argument("--cost-model", default="calibrated", help="calibrated or vidur:DIR")
    p.add_argument("--context", type=int, default=1024, help="context tokens of each decoding sequence")
    p.add_argument("--plot", default=None, help="write the stacked bars (PNG)")


def breakdowns(model: str, hardware: str, tp: int, cost_model: str, context: int) -> dict[str, dict[str, float]]:
    """Step label -> `step_breakdown` of that step."""
    cm = gpu_cost_model(cost_model, model, hardware, tp=tp)
    out = {f"decode x{b}": step_breakdown(model, hardware, tp=tp, cost_model=cm, num_decode_tokens=b,
                                          decode_context_sum=b * context) for b in DECODE_BATCHES}
    out.update({f"prefill {n}": step_breakdown(model, hardware, tp=tp, cost_model=cm, num_prefill_tokens=n)
                for n in PREFILL_CHUNKS})
    return out


def plot(steps: dict[str, dict[str, float]], title: str, path: str | Path) -> None:
    """Stacked bars, one part a colour and a hatch (apart in greyscale), in the project's style."""
    import matplotlib.pyplot as plt

    from .plots import PALETTE, figure, legend_below, save

    parts = [k for k in BREAKDOWN_KEYS if k != "total" and any(s[k] for s in steps.values())]
    fig, axes = figure(1, 1, height=2.6)
    ax = axes[0, 0]
    labels = list(steps)
    bottom = [0.0] * len(labels)
    for i, part in enumerate(parts):
        heights = [steps[label][part] * 1e3 for label in labels]
        ax.bar(labels, heights, bottom=bottom, label=part, color=PALETTE[i % len(PALETTE)],
               hatch=("", "///", "...", "xx", "\\\\", "++", "oo")[i % 7], edgecolor="white")
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_ylabel("ms per step")
    ax.set_title(title)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    legend_below(fig, axes, ncol=3)
    save(fig, path)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    from paged.output_paths import check_output_paths

    from .memory import check_tp
    from .models import get_model
    from .plots import check_figure_format

    check_tp(get_model(args.model), args.tp)
    if args.context < 1:
        raise ValueError(f"--context {args.context}: expected tokens >= 1")
    check_output_paths([("--plot", args.plot, ".png")])
    check_figure_format("--plot", args.plot)
    steps = breakdowns(args.model, args.hardware, args.tp, args.cost_model, args.context)
    print(f"{args.model} on {args.tp} x {args.hardware} ({args.cost_model}), ms per step")
    print(f"{'step':<14}" + "".join(f"{k:>14}" for k in BREAKDOWN_KEYS))
    for label, parts in steps.items():
        print(f"{label:<14}" + "".join(f"{parts[k] * 1e3:14.3f}" for k in BREAKDOWN_KEYS))
    if args.plot:
        plot(steps, f"{args.model} on {args.tp} x {args.hardware}: where a step's time goes", args.plot)
        print(f"figure: {args.plot}")
    return 0
