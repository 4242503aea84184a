"""The workload's command-line options and the workload they name, shared by the simulator
(`python -m sim run`) and the load generator (`paged bench serve`), so that one command line
selects the same requests for a simulated and for a real replay.
"""
from __future__ import annotations

import argparse
import math

from .traces import FORMATS
from .workload import Workload, load_workload, select, shared_prefix_workload

WORKLOAD_KEYS = ("trace", "shared_prefix", "format", "num_requests", "start_s", "duration_s", "time_scale", "arrival",
                 "rate", "cv", "seed", "cap_lengths")


def numbers(text: str, names: str, kind=float) -> tuple:
    """'1,0,2' -> (1.0, 0.0, 2.0): as many numbers as `names` names, comma-separated."""
    parts = str(text).split(",")
    try:
        if len(parts) != len(names.split(",")):
            raise ValueError
        return tuple(kind(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {names}") from None


def _finite(text: str, ok, expected: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and ok(value)):
        raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
    return value


def positive(text: str) -> float:
    """A finite number > 0 (a latency target, a tolerance): zero or less would make every run miss,
    or a search never end."""
    return _finite(text, lambda v: v > 0, "a finite number > 0")


def non_negative(text: str) -> float:
    """A finite number >= 0 (seconds into a trace)."""
    return _finite(text, lambda v: v >= 0, "a finite number >= 0")


def shared_prefix_arg(text: str) -> tuple[int, int, int, int]:
    return numbers(text, "GROUPS,PREFIX,SUFFIX,OUTPUT", int)


def add_workload_options(p: argparse.ArgumentParser, trace_default=None) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--trace", default=trace_default, help="trace file (this or --shared-prefix names the workload)")
    g.add_argument("--shared-prefix", type=shared_prefix_arg, default=None, metavar="GROUPS,PREFIX,SUFFIX,OUTPUT",
                   help="instead of a trace: --num-requests synthetic requests at --rate, in GROUPS groups each "
                        "sharing a PREFIX-token system prompt, then SUFFIX tokens of their own, OUTPUT tokens out")
    g.add_argument("--format", default="auto", choices=("auto", *FORMATS),
                   help="trace format (auto: from the header, or .jsonl for Mooncake; traces/README.md)")
    g.add_argument("--num-requests", type=int, default=None, help="take the first N requests (default: all)")
    g.add_argument("--start-s", type=non_negative, default=0.0, help="time window start (s after the first arrival)")
    g.add_argument("--duration-s", type=float, default=None, help="time window length (default: to the end)")
    g.add_argument("--time-scale", type=float, default=1.0, help="multiply inter-arrival times (0.5 doubles the load)")
    g.add_argument("--arrival", default="poisson", choices=("poisson", "gamma", "constant"),
                   help="synthetic arrivals for length-only traces")
    g.add_argument("--rate", type=float, default=None,
                   help="requests/s of synthetic arrivals (length-only traces and --shared-prefix only)")
    g.add_argument("--cv", type=float, default=1.0, help="burstiness of gamma arrivals")
    g.add_argument("--seed", type=int, default=0, help="seed of synthetic arrivals")
    g.add_argument("--no-cap", dest="cap_lengths", action="store_false",
                   help="let the scheduler reject requests longer than max_model_len instead of truncating them "
                        "(the summary's num_capped counts the truncated ones)")


def workload_from_args(args: argparse.Namespace, max_model_len: int | None, block_size: int) -> Workload:
    """The workload the options of `add_workload_options` name. `max_model_len` caps lengths
    (None or --no-cap: no cap); a shared-prefix group's prompt is named in blocks of
    `block_size` tokens."""
    if (args.trace is None) == (args.shared_prefix is None):
        in_file = " (or `trace:` in a --config file)" if hasattr(args, "config") else ""  # only sim run has one
        raise ValueError(f"give one of --trace PATH{in_file} and --shared-prefix G,P,S,O")
    cap = max_model_len if args.cap_lengths else None
    if args.shared_prefix is not None:
        if args.num_requests is None or args.rate is None:
            raise ValueError("--shared-prefix needs --num-requests and --rate (synthetic arrivals)")
        if args.num_requests < 1:
            raise ValueError(f"num_requests={args.num_requests}: expected >= 1")
        if args.start_s or args.duration_s is not None:
            raise ValueError("--start-s/--duration-s select a window of a trace; a --shared-prefix workload is "
                             "sized by --num-requests")
        groups, prefix, suffix, output = args.shared_prefix
        generated = shared_prefix_workload(args.num_requests, groups, prefix, suffix, output, args.rate, args.arrival,
                                           args.cv, args.seed, hash_id_block_size=block_size)
        return select(generated, time_scale=args.time_scale, max_model_len=cap)
    return load_workload(args.trace, args.format, num_requests=args.num_requests, start_s=args.start_s,
                         duration_s=args.duration_s, time_scale=args.time_scale, arrival=args.arrival,
                         rate=args.rate, cv=args.cv, seed=args.seed, max_model_len=cap)

