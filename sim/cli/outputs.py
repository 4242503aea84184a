"""What `python -m sim run` writes: the summary JSON, per-request and time-series CSVs, a figure."""
from __future__ import annotations

import json

from paged.metrics_summary import jsonable
from paged.output_paths import check_output_paths as check_paths
from paged.output_paths import written

# dest -> (option, the suffix of an example file name)
OUTPUT_OPTIONS = {"json": ("--json", ".json"), "requests_csv": ("--requests-csv", ".csv"),
                  "timeseries_csv": ("--timeseries-csv", ".csv"), "plot": ("--plot", ".png")}


def check_output_paths(args) -> None:
    """Every output path the run was asked for can be written, checked before simulating
    (`paged.output_paths`), and a figure's format is one matplotlib writes."""
    check_paths([(option, getattr(args, dest, None), suffix) for dest, (option, suffix) in OUTPUT_OPTIONS.items()])
    if getattr(args, "plot", None):
        from ..plots import check_figure_format  # only then: a run without a figure never imports sim.plots

        check_figure_format("--plot", args.plot)


def files_line(args, options: dict[str, tuple[str, str]] = OUTPUT_OPTIONS) -> str | None:
    """The line that ends a command's output: the files it wrote, each with its option (as `sim
    demo` and the experiments say where their files went); None when it wrote none."""
    paths = [f"{getattr(args, dest)} ({option})" for dest, (option, _) in options.items() if getattr(args, dest, None)]
    return f"written: {', '.join(paths)}" if paths else None


def write_outputs(args, result, summary: dict, workload, config) -> None:
    """Every output the run was asked for, from the finished result; a write that fails names its option."""
    if args.json:
        source = {"trace": str(args.trace)} if args.trace is not None else {"shared_prefix": args.shared_prefix}
        doc = {**summary, "workload": {**source, "name": workload.name}, "config": config.to_dict()}
        with written("--json", args.json) as path:
            path.write_text(json.dumps(jsonable(doc), indent=2) + "\n")
    if args.requests_csv:
        df = result.requests
        if "itl_s" in df:  # a JSON list per cell: numpy's repr wraps lines and elides long arrays
            df = df.assign(itl_s=[json.dumps(x.tolist()) if x is not None else "" for x in df.itl_s])
        with written("--requests-csv", args.requests_csv) as path:
            df.to_csv(path, index=False)
    if args.timeseries_csv:
        with written("--timeseries-csv", args.timeseries_csv) as path:
            result.timeseries.to_csv(path, index=False)
    if args.plot:
        with written("--plot", args.plot) as path:
            result.plot(path)
