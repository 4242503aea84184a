"""Command line: `python -m sim run|demo|bench|fit|calibrate|breakdown|list`.

    python -m sim run --trace traces/azure_llm_2023_conv.csv --model llama-2-7b --hardware a100-80gb --json out.json
    python -m sim run --config experiment.yaml --replicas 4      # the command line overrides the file

A YAML config file (safe-loaded) holds the same options, named as the `dest` of each option
below: SimConfig's field names (`enable_prefix_caching: false`) and the workload's
(`trace`, `num_requests`, `time_scale`, ...).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from . import breakdown, calibrate_cmd
from .config import ROUTERS, SimConfig

REPO = Path(__file__).resolve().parent.parent
AZURE_CONV = REPO / "traces" / "azure_llm_2023_conv.csv"
WORKLOAD_KEYS = ("trace", "shared_prefix", "format", "num_requests", "start_s", "duration_s", "time_scale", "arrival",
                 "rate", "cv", "seed", "cap_lengths")
OUTPUT_KEYS = ("json", "requests_csv", "timeseries_csv", "plot", "slo_ttft_s", "slo_tpot_s", "progress_bar")


def _add_sim_options(p: argparse.ArgumentParser) -> None:
    d = SimConfig()
    g = p.add_argument_group("deployment")
    g.add_argument("--model", default=d.model)
    g.add_argument("--hardware", default=d.hardware)
    g.add_argument("--tp", type=int, default=d.tp, help="tensor-parallel GPUs per replica")
    g.add_argument("--replicas", type=int, default=d.replicas)
    g.add_argument("--router", default=d.router, choices=ROUTERS)
    g = p.add_argument_group("KV cache")
    g.add_argument("--block-size", type=int, default=d.block_size)
    g.add_argument("--kv-cache-dtype", default=d.kv_cache_dtype, choices=("fp16", "fp8", "int8", "int4"))
    g.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization)
    g.add_argument("--num-gpu-blocks", type=int, default=d.num_gpu_blocks, help="override what memory leaves")
    g.add_argument("--swap-space-gib", type=float, default=d.swap_space_gib)
    g.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false")
    g.add_argument("--watermark", type=float, default=d.watermark)
    g = p.add_argument_group("scheduler")
    g.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    g.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    g.add_argument("--max-model-len", type=int, default=d.max_model_len, help="default: the model's context")
    g.add_argument("--no-chunked-prefill", dest="enable_chunked_prefill", action="store_false")
    g.add_argument("--long-prefill-token-threshold", type=int, default=d.long_prefill_token_threshold)
    g.add_argument("--policy", default=d.policy,
                   help="fcfs | priority | sjf | edf | lpm. priority reads the trace's optional priority and "
                        "business_value columns; edf serves by deadline: the trace's slo_s column, else "
                        "arrival + --slo-ttft-s + --slo-tpot-s * (output tokens - 1); sjf ranks by prompt + "
                        "max_tokens, which on a trace is the true output length (an oracle)")
    g.add_argument("--priority-weights", type=_weights, default=d.priority_weights, metavar="A,B,C",
                   help="priority's P = A*wait_time + B*expected_tokens + C*business_value (default 1,0,1)")
    g.add_argument("--preemption", default=d.preemption, choices=("recompute", "swap"))
    g.add_argument("--static-batching", action="store_true", help="the traditional baseline instead of paging")
    g.add_argument("--static-batch-size", type=int, default=d.static_batch_size)
    g.add_argument("--batch-timeout-s", type=float, default=d.batch_timeout_s)
    g.add_argument("--static-reserve", choices=["max_model_len", "max_tokens"], default=d.static_reserve,
                   help="KV a static batch reserves per request")
    g = p.add_argument_group("cost model")
    g.add_argument("--cost-model", default=d.cost_model,
                   help="calibrated (fitted to measured GPU profiles), vidur:DIR (Vidur's measured mlp.csv profiles "
                        "under DIR), roofline, or a paged-step-profile/1 JSON file")
    g.add_argument("--mfu-efficiency", type=float, default=d.mfu_efficiency, help="roofline only")
    g.add_argument("--bandwidth-efficiency", type=float, default=d.bandwidth_efficiency, help="roofline only")
    g.add_argument("--step-overhead-s", type=float, default=d.step_overhead_s)
    g = p.add_argument_group("simulator")
    g.add_argument("--no-fast-path", dest="fast_path", action="store_false", help="step one iteration at a time")
    g.add_argument("--record-itl", action="store_true",
                   help="keep every inter-token latency of every request (the itl_s column of --requests-csv)")
    g.add_argument("--timeseries-interval-s", type=float, default=None)


def _numbers(text: str, names: str, kind=float) -> tuple:
    """'1,0,2' -> (1.0, 0.0, 2.0): as many numbers as `names` names, comma-separated."""
    parts = str(text).split(",")
    try:
        if len(parts) != len(names.split(",")):
            raise ValueError
        return tuple(kind(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {names}") from None


def _weights(text: str) -> tuple[float, float, float]:
    return _numbers(text, "A,B,C")


def _shared_prefix(text: str) -> tuple[int, int, int, int]:
    return _numbers(text, "GROUPS,PREFIX,SUFFIX,OUTPUT", int)


def _add_workload_options(p: argparse.ArgumentParser, trace_default=None) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--trace", default=trace_default, help="trace file (required unless in --config)")
    g.add_argument("--shared-prefix", type=_shared_prefix, default=None, metavar="GROUPS,PREFIX,SUFFIX,OUTPUT",
                   help="instead of a trace: --num-requests synthetic requests at --rate, in GROUPS groups each "
                        "sharing a PREFIX-token system prompt, then SUFFIX tokens of their own, OUTPUT tokens out")
    g.add_argument("--format", default="auto", choices=("auto", "azure", "vidur", "mooncake", "lengths"))
    g.add_argument("--num-requests", type=int, default=None, help="take the first N requests")
    g.add_argument("--start-s", type=float, default=0.0, help="time window start (s after the first arrival)")
    g.add_argument("--duration-s", type=float, default=None, help="time window length")
    g.add_argument("--time-scale", type=float, default=1.0, help="multiply inter-arrival times (0.5 doubles the load)")
    g.add_argument("--arrival", default="poisson", choices=("poisson", "gamma", "constant"),
                   help="synthetic arrivals for length-only traces")
    g.add_argument("--rate", type=float, default=None, help="requests/s of synthetic arrivals")
    g.add_argument("--cv", type=float, default=1.0, help="burstiness of gamma arrivals")
    g.add_argument("--seed", type=int, default=0, help="seed of synthetic arrivals")
    g.add_argument("--no-cap", dest="cap_lengths", action="store_false",
                   help="let the scheduler reject requests longer than max_model_len instead of truncating them")


def _add_output_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--json", default=None, help="write the summary (and config) as one JSON object")
    g.add_argument("--requests-csv", default=None, help="write the per-request records")
    g.add_argument("--timeseries-csv", default=None)
    g.add_argument("--plot", default=None, help="write the latency CDF / KV usage figure (PNG)")
    g.add_argument("--slo-ttft-s", type=float, default=None, help="goodput: TTFT target")
    g.add_argument("--slo-tpot-s", type=float, default=None, help="goodput: TPOT target")
    g.add_argument("--no-progress", dest="progress_bar", action="store_false")


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The parser, and its `run` subparser (whose defaults a --config file replaces)."""
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="simulate a trace")
    run.add_argument("--config", default=None, help="YAML file with the same options")
    _add_workload_options(run)
    _add_sim_options(run)
    _add_output_options(run)
    demo = sub.add_parser("demo", help="the Azure conversation trace on Llama-2-7B / A100-80GB, with a figure")
    demo.add_argument("--out", default=str(REPO / "experiments" / "results" / "demo"))
    demo.add_argument("--num-requests", type=int, default=None)
    fit = sub.add_parser("fit", help="fit a cost model to a step profile and report its error")
    fit.add_argument("profile")
    calibrate_cmd.add_parser(sub)
    breakdown.add_parser(sub)
    sub.add_parser("list", help="known models, hardware, routers, policies, trace formats")
    sub.add_parser("bench", help="simulated requests per wall second and peak memory (see sim.bench)",
                   add_help=False)
    return parser, run


def _sim_config(args: argparse.Namespace) -> SimConfig:
    return SimConfig(**{k: getattr(args, k) for k in SimConfig.field_names() if hasattr(args, k)})


def _load_yaml(path: str, parser: argparse.ArgumentParser, run: argparse.ArgumentParser,
               argv: list[str]) -> argparse.Namespace:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            cfg = yaml.safe_load(f) or {}
    except OSError as e:
        raise SystemExit(f"{path}: cannot read the config file: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise SystemExit(f"{path}: not valid YAML: {e}") from None
    if not isinstance(cfg, dict):
        raise SystemExit(f"{path}: expected a mapping of option names to values")
    known = set(SimConfig.field_names()) | set(WORKLOAD_KEYS) | set(OUTPUT_KEYS)
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise SystemExit(f"{path}: unknown option(s) {unknown}; known are {sorted(known)}")
    run.set_defaults(**{k: _yaml_value(path, k, v, run) for k, v in cfg.items()})
    return parser.parse_args(argv)


def _yaml_value(path: str, key: str, value, run: argparse.ArgumentParser):
    """A config file's value, held to what the command line would accept for the same option:
    a switch takes true/false (the string "false" is not false), a typed option its type, and
    a file named by a relative path is found next to the config file."""
    action = next((a for a in run._actions if a.dest == key), None)
    if action is None:  # a SimConfig field without a command-line option: SimConfig checks it
        return value
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise SystemExit(f"{path}: {key}={value!r}: expected true or false")
        return value
    if value is None:
        if action.default is not None:
            raise SystemExit(f"{path}: {key}=null: expected a value (the default is {action.default!r})")
        return value
    if action.type in (_weights, _shared_prefix) and isinstance(value, list):
        value = ",".join(str(x) for x in value)
    if action.type is int and isinstance(value, float):
        raise SystemExit(f"{path}: {key}={value!r}: expected an integer")
    if action.type is not None and not (isinstance(action.type, type) and isinstance(value, action.type)):
        try:
            value = action.type(value)
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            expected = {_weights: "three numbers A,B,C", _shared_prefix: "four integers GROUPS,PREFIX,SUFFIX,OUTPUT"
                        }.get(action.type, f"a value of type {action.type.__name__}")
            raise SystemExit(f"{path}: {key}={value!r}: expected {expected}") from None
    if action.choices is not None and value not in action.choices:
        raise SystemExit(f"{path}: {key}={value!r}: expected one of {list(action.choices)}")
    if key in ("trace", "cost_model") and isinstance(value, str) and value != "roofline":
        candidate = Path(path).parent / value
        if not Path(value).is_absolute() and candidate.exists():
            value = str(candidate)
    return value


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, float) and math.isnan(x):
        return None
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    return x


def cmd_run(args: argparse.Namespace) -> int:
    from .report import format_summary
    from .runner import simulate
    from .workload import load_workload, select, shared_prefix_workload

    if (args.trace is None) == (args.shared_prefix is None):
        raise SystemExit("run: give --trace PATH or --shared-prefix G,P,S,O (or `trace:` in --config), not both")
    config = _sim_config(args)
    from .models import get_model

    max_len = config.max_model_len or get_model(config.model).max_model_len
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
                                           args.cv, args.seed, hash_id_block_size=config.block_size)
        workload = select(generated, time_scale=args.time_scale, max_model_len=max_len if args.cap_lengths else None)
    else:
        workload = load_workload(args.trace, args.format, num_requests=args.num_requests, start_s=args.start_s,
                                 duration_s=args.duration_s, time_scale=args.time_scale, arrival=args.arrival,
                                 rate=args.rate, cv=args.cv, seed=args.seed,
                                 max_model_len=max_len if args.cap_lengths else None)
    if config.policy == "edf" and workload.deadline_s is None:
        if args.slo_ttft_s is None and args.slo_tpot_s is None:
            raise ValueError(f"policy edf needs deadlines, and {workload.name} has no slo_s column: give --slo-ttft-s "
                             "and/or --slo-tpot-s (deadline = arrival + TTFT + TPOT * (output tokens - 1))")
        workload = workload.with_slo_deadlines(*(math.inf if v is None else v
                                                 for v in (args.slo_ttft_s, args.slo_tpot_s)))
    if args.progress_bar and len(workload) >= 20_000:
        config.progress = True
    result = simulate(workload, config)
    summary = result.summary()
    if args.slo_ttft_s is not None or args.slo_tpot_s is not None:
        summary["goodput"] = result.goodput(args.slo_ttft_s if args.slo_ttft_s is not None else math.inf,
                                            args.slo_tpot_s if args.slo_tpot_s is not None else math.inf)
    print(format_summary(summary))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        source = {"trace": str(args.trace)} if args.trace is not None else {"shared_prefix": args.shared_prefix}
        doc = {**summary, "workload": {**source, "name": workload.name}, "config": config.to_dict()}
        Path(args.json).write_text(json.dumps(_jsonable(doc), indent=2) + "\n")
    if args.requests_csv:
        df = result.requests
        if "itl_s" in df:  # a JSON list per cell: numpy's repr wraps lines and elides long arrays
            df = df.assign(itl_s=[json.dumps(x.tolist()) if x is not None else "" for x in df.itl_s])
        df.to_csv(args.requests_csv, index=False)
    if args.timeseries_csv:
        result.timeseries.to_csv(args.timeseries_csv, index=False)
    if args.plot:
        result.plot(args.plot)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .models import get_model
    from .report import format_summary
    from .runner import simulate
    from .workload import load_workload

    config = SimConfig(model="llama-2-7b", hardware="a100-80gb")
    workload = load_workload(AZURE_CONV, num_requests=args.num_requests,
                             max_model_len=get_model(config.model).max_model_len)
    print(f"Replaying {len(workload):,} requests of {AZURE_CONV.name} on {config.model} / {config.hardware} ...")
    result = simulate(workload, config)
    summary = result.summary()
    print(format_summary(summary))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result.plot(out / "demo.png")
    (out / "summary.json").write_text(json.dumps(_jsonable({**summary, "config": config.to_dict()}), indent=2) + "\n")
    print(f"\n{summary['num_requests']:,} requests, {summary['simulated_time_s']:,.0f} s simulated in "
          f"{summary['wall_time_s']:.2f} s wall: {summary['sim_requests_per_wall_s']:,.0f} simulated requests/s")
    print(f"figure: {out / 'demo.png'}; summary: {out / 'summary.json'}")
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from .profiled import fit_profile

    fit = fit_profile(args.profile)
    print(fit.cost_model.description)
    for k, v in fit.coefficients_s.items():
        print(f"  {k:<26} {v:.4g} s")
    return 0


def cmd_list(_args: argparse.Namespace) -> int:
    from paged.policies import POLICIES

    from .hardware import HARDWARE
    from .models import KV_DTYPES, MODELS
    from .traces import FORMATS

    for title, names in (("models", MODELS), ("hardware", HARDWARE), ("routers", ROUTERS), ("policies", POLICIES),
                         ("kv cache dtypes", KV_DTYPES), ("trace formats", FORMATS)):
        print(f"{title}: {', '.join(names)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from .bench import main as bench_main

        return bench_main(argv[1:])
    parser, run = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "config", None):
            args = _load_yaml(args.config, parser, run, argv)
        return {"run": cmd_run, "demo": cmd_demo, "fit": cmd_fit, "list": cmd_list, "calibrate": calibrate_cmd.run,
                "breakdown": breakdown.run}[args.command](args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
