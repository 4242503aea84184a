"""What `python -m sim run` writes: the summary JSON, per-request and time-series CSVs, a figure."""
from __future__ import annotations

import json
from pathlib import Path

from paged.metrics_summary import jsonable


def write_outputs(args, result, summary: dict, workload, config) -> None:
    """Every output the run was asked for, from the finished result."""
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
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
