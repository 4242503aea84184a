"""What `python -m sim run` writes: the summary JSON, per-request and time-series CSVs, a figure."""
from __future__ import annotations

import json
import os
from pathlib import Path

from paged.metrics_summary import jsonable

# dest -> (option, the suffix of an example file name)
OUTPUT_OPTIONS = {"json": ("--json", ".json"), "requests_csv": ("--requests-csv", ".csv"),
                  "timeseries_csv": ("--timeseries-csv", ".csv"), "plot": ("--plot", ".png")}


def check_output_paths(args) -> None:
    """Every output path the run was asked for can be written, checked before simulating: a long
    run must not end in a traceback that loses its results. Each must name a file, not a folder;
    its folder may be missing (it is created), but then the nearest existing ancestor must be a
    writable folder, not a file. Two outputs may not share a path (one would overwrite the other)."""
    seen: dict[Path, str] = {}
    for dest, (option, suffix) in OUTPUT_OPTIONS.items():
        value = getattr(args, dest, None)
        if not value:
            continue
        path = Path(value)
        if path.is_dir():
            raise ValueError(f"{option} {value}: is a folder; expected a file path, such as {path / ('out' + suffix)}")
        resolved = path.resolve()
        if resolved in seen:
            raise ValueError(f"{option} {value}: {seen[resolved]} writes the same file; expected distinct paths")
        seen[resolved] = option
        folder = path.absolute().parent
        while not folder.exists():
            folder = folder.parent
        if not folder.is_dir():
            raise ValueError(f"{option} {value}: {folder} is a file, so it cannot hold {path.name}; expected a "
                             "path under a folder")
        target = path if path.exists() else folder
        if not os.access(target, os.W_OK):
            raise ValueError(f"{option} {value}: {target} is not writable; expected a path this user may write")
        if dest == "plot" and path.suffix:
            from matplotlib.figure import Figure

            formats = Figure().canvas.get_supported_filetypes()
            if path.suffix[1:].lower() not in formats:
                raise ValueError(f"{option} {value}: matplotlib cannot write {path.suffix} files; expected one of "
                                 f"{sorted(formats)}")


def write_outputs(args, result, summary: dict, workload, config) -> None:
    """Every output the run was asked for, from the finished result."""
    for dest in OUTPUT_OPTIONS:
        if getattr(args, dest, None):
            Path(getattr(args, dest)).parent.mkdir(parents=True, exist_ok=True)
    if args.json:
        source = {"trace": str(args.trace)} if args.trace is not None else {"shared_prefix": args.shared_prefix}
        doc = {**summary, "workload": {**source, "name": workload.name}, "config": config.to_dict()}
        Path(args.json).write_text(json.dumps(jsonable(doc), indent=2) + "\n")
    if args.requests_csv:
        df = result.requests
        if "itl_s" in df:  # a JSON list per cell: numpy's repr wraps lines and elides long arrays
            df = df.assign(itl_s=[json.dumps(x.tolist()) if x is not None else "" for x in df.itl_s])
        df.to_csv(args.requests_csv, index=False)
    if args.timeseries_csv:
        result.timeseries.to_csv(args.timeseries_csv, index=False)
    if args.plot:
        result.plot(args.plot)
