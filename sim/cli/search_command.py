"""`python -m sim search`: the config search's command line (the search itself is `sim.search`)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from paged.metrics_summary import jsonable
from paged.output_paths import check_output_paths, written
from paged.workloads.options import add_workload_options, positive

from ..parallel import BACKENDS
from ..sim_config import ROUTERS
from .outputs import files_line

OUTPUTS = {"json": ("--json", ".json"), "plot": ("--plot", ".png")}  # dest -> (option, an example's suffix)


def _list(kind):
    def parse(text: str) -> list:
        try:
            return [kind(x.strip()) for x in str(text).split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list") from None
    return parse


def add_search_parser(sub) -> None:
    """The lists' defaults are strings, which argparse parses with the option's type as it
    would the command line's (and --help shows as typed)."""
    p = sub.add_parser("search", help="each deployment's max request rate within p99 TTFT/TPOT SLOs")
    add_workload_options(p)  # the arrivals' scale is the search's: a length-only trace's --rate only seeds them
    p.add_argument("--model", default="llama-2-7b", help="model spec (python -m sim list names them)")
    p.add_argument("--hardware", type=_list(str), default="a100-80gb", help="comma-separated, e.g. a100-80gb,h100")
    p.add_argument("--tp", type=_list(int), default="1", help="tensor-parallel GPUs per replica, comma-separated")
    p.add_argument("--replicas", type=_list(int), default="1", help="replicas, comma-separated")
    p.add_argument("--router", type=_list(str), default="round_robin", help=f"comma-separated of {list(ROUTERS)}")
    p.add_argument("--max-num-seqs", type=_list(int), default="256", help="most requests in one step, comma-separated")
    p.add_argument("--slo-ttft-p99", type=positive, required=True, help="p99 TTFT target (s)")
    p.add_argument("--slo-tpot-p99", type=positive, required=True, help="p99 TPOT target (s)")
    p.add_argument("--rtol", type=positive, default=0.02, help="bisection stops when top / bottom <= 1 + rtol")
    p.add_argument("--gpu-hour-usd", default="",
                   help="hw=price,... over the defaults of sim.prices (a spec file's GPU: by its name)")
    p.add_argument("--backend", default="processes", choices=BACKENDS,
                   help="where the simulations run: local processes or a Ray cluster")
    p.add_argument("--ray-address", default=None, help="a Ray cluster to join (default: a local one)")
    p.add_argument("--workers", type=int, default=None,
                   help="parallel simulations (default: one per core, or per CPU of the Ray cluster)")
    p.add_argument("--json", default=None, help="write every deployment's row, the SLOs and the workload (JSON)")
    p.add_argument("--plot", default=None, help="the Pareto figure (PNG)")
    p.add_argument("--no-progress", dest="progress_bar", action="store_false", help="no progress bar")


def cmd_search(args: argparse.Namespace) -> int:
    import time

    from paged.workloads.options import workload_from_args
    from paged.workloads.traces import detect_format

    from ..hardware import get_hardware
    from ..models import get_model
    from ..plots import check_figure_format  # here, not at the top: `sim run` builds this parser too
    from ..prices import parse_prices
    from ..search import SLO, search
    from ..search_report import format_table, infeasible_notes, pareto_figure
    from ..sim_config import SimConfig
    from ..sweep import grid

    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers {args.workers}: expected at least 1 (or leave it out: one per core)")
    check_output_paths([(option, getattr(args, dest), suffix) for dest, (option, suffix) in OUTPUTS.items()])
    check_figure_format("--plot", args.plot)
    for name in args.hardware:  # a misspelt GPU is named now, not after the other deployments' searches
        get_hardware(name)
    if args.trace is not None and Path(args.trace).is_file() and args.rate is None and "lengths" == (
            detect_format(args.trace) if args.format == "auto" else args.format):
        args.rate = 1.0  # Poisson arrivals, which the search rescales
    workload = workload_from_args(args, get_model(args.model).max_model_len, block_size=16)
    configs = grid(SimConfig(model=args.model), hardware=args.hardware, tp=args.tp, replicas=args.replicas,
                   router=args.router, max_num_seqs=args.max_num_seqs)
    slo = SLO(args.slo_ttft_p99, args.slo_tpot_p99)
    start = time.perf_counter()
    prices = parse_prices(args.gpu_hour_usd, args.hardware)
    df = search(workload, configs, slo, rtol=args.rtol, prices=prices, backend=args.backend, workers=args.workers,
                address=args.ray_address, progress=args.progress_bar)
    wall = time.perf_counter() - start
    for note in infeasible_notes(df):
        print(note)
    print(format_table(df))
    print(f"{len(configs)} deployments, {int(df.num_runs.sum())} simulations (capacity runs included) on "
          f"{len(workload):,} requests of {workload.name} in {wall:.1f} s (p99 TTFT <= {slo.ttft_p99_s:g} s, "
          f"p99 TPOT <= {slo.tpot_p99_s:g} s, rtol {args.rtol:g})")
    if args.json:
        doc = {"workload": {"trace": str(args.trace), "shared_prefix": args.shared_prefix, "name": workload.name,
                            "num_requests": len(workload)},
               "slo": {"ttft_p99_s": slo.ttft_p99_s, "tpot_p99_s": slo.tpot_p99_s}, "rtol": args.rtol,
               "wall_time_s": wall, "rows": [jsonable(r) for r in df.to_dict("records")]}
        with written("--json", args.json) as path:
            path.write_text(json.dumps(doc, indent=2) + "\n")
    if args.plot:
        with written("--plot", args.plot) as path:
            pareto_figure(df, path)
    if line := files_line(args, OUTPUTS):
        print(line)
    return 0
