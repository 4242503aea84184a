"""How many requests `deploy_check.py` needs before its prediction stops turning on a few of them.

The deployment check compares a prediction with one replay on a shared machine whose speed moves by
several percent between the calibration and the replay. A metric that a 1% change of step time moves
by far more than 1% (a median between the hits' and the misses' TTFT, a hit rate that turns on which
request finished first and so where the next ones went) cannot be checked to 10% however good the
model. So this simulates the check's slice, at the check's load, for each size and router, with the
served engines' steps scaled by each of `SPEEDS` (the workload fixed, as the replay's is), and
measures each metric's jitter: its largest distance from the least-squares line through its values
over the speeds (relative; absolute for the hit rate). The line is the smooth response to the
machine's speed, which the check's drift lines explain; the jitter is what no drift line can. It
does so for one simulation at each speed and for the check's prediction (`deploy_check.predict`,
the mean over `deploy_check.ENSEMBLE` around it). It also counts, at each speed, the metrics one
simulation (a replay exactly as simulated) misses the prediction by more than the check's goals: the
check's pass rate were the model exact, which is the most a design of the check can promise. Simulation
only: minutes on one core.

    python experiments/deploy_slice_size.py --from DIR [--sizes 36,108] [--seeds 0,1] [--load 0.35]
        [--set num_gpu_blocks=104,num_groups=8]

DIR is a `deploy_check.py` output (its profile.json and the calibration in deploy_check.json make the
served cost model, as the check's prediction does); `--seeds` draws the groups anew (`deploy_check.SEED`).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import deploy_check as dc
import numpy as np
import pandas as pd
import served_steps
from common import at_load, saturation_throughput
from served_steps import ServedSpeed

from sim import SimConfig, simulate
from sim.profiled import fit_profile

SPEEDS = tuple(np.round(np.linspace(0.95, 1.05, 11), 3))  # step time over the calibration's
METRICS = ("ttft_s_mean", "ttft_s_p50", "tpot_s_mean", "tpot_s_p50", "e2e_s_mean", "e2e_s_p50", "throughput_req_s",
           "prefix_cache_hit_rate")


def sweep(run: Path, sizes: list[int], seeds: list[int], load: float, base: dc.Setup = dc.FULL) -> pd.DataFrame:
    """Each metric for each seed, size, speed, router, and way of predicting ("single": one
    simulation; "ensemble": `deploy_check.predict`), on `base` of that size and load."""
    doc = json.loads((run / "deploy_check.json").read_text())
    calibration = doc["conditions"]["calibration"]
    served = ServedSpeed(**calibration["served"])
    fit = fit_profile(dc.run_profile(run, doc))
    frontend = float(np.median([r["frontend_latency_s"] for r in doc["routers"].values()]))
    rows = []
    for seed in seeds:
        dc.SEED = seed
        for n in sizes:
            setup = replace(base, num_requests=n, load=load)
            config = SimConfig(model=dc.MODEL, cost_model=served_steps.served_cost_model(fit, served),
                               num_gpu_blocks=setup.num_gpu_blocks, block_size=dc.BLOCK_SIZE,
                               max_num_seqs=setup.max_num_seqs, max_num_batched_tokens=setup.max_num_batched_tokens,
                               max_model_len=setup.max_model_len, replicas=dc.REPLICAS, frontend_latency_s=frontend)
            trace = dc.shared_prefix_slice(setup)
            workload = at_load(trace, setup.load * saturation_throughput(trace, config))
            for router in dc.ROUTERS:
                routed = replace(config, router=router)
                for speed in SPEEDS:
                    single = dc.flat(simulate(workload, replace(routed, cost_model=served_steps.served_cost_model(
                        fit, served.slower(speed)))).summary())
                    ensemble = dc.predict(workload, routed, fit, served.slower(speed))
                    rows += [{"seed": seed, "num_requests": n, "router": router, "speed": speed, "way": way,
                              "metric": k, "value": values[k], "span_s": float(workload.arrival_s[-1])}
                             for way, values in (("single", single), ("ensemble", ensemble)) for k in METRICS]
    return pd.DataFrame(rows)


def jitter(frame: pd.DataFrame) -> pd.DataFrame:
    """Per seed, size, router, way and metric: the largest distance of a speed's value from the
    least-squares line over the speeds (relative to the value at speed 1; absolute for the hit
    rate), and the line's slope relative to that value (the metric's elasticity to step time)."""
    def one(g: pd.DataFrame) -> pd.Series:
        x = g.speed.to_numpy() - 1.0
        nominal = g.value[np.isclose(x, 0)].iloc[0]
        slope, intercept = np.polyfit(x, g.value, 1)
        residual = float(np.abs(g.value - (intercept + slope * x)).max())
        hit = g.metric.iloc[0] == "prefix_cache_hit_rate"
        return pd.Series({"jitter": residual if hit else residual / nominal, "elasticity": slope / nominal})
    keys = ["seed", "num_requests", "router", "way", "metric"]
    return frame.groupby(keys, sort=False)[["speed", "value", "metric"]].apply(one).reset_index()


def misses(frame: pd.DataFrame) -> pd.DataFrame:
    """Per seed, size and speed: how many of the check's judged metrics (every router's) one
    simulation misses the prediction at the same speed by more than the check's goals
    (`deploy_check.rel_error`, `deploy_check.goal`)."""
    wide = frame.pivot_table(index=["seed", "num_requests", "speed", "router", "metric"], columns="way",
                             values="value").reset_index()
    wide["miss"] = [abs(dc.rel_error(k, predicted, replay)) > dc.goal(k)
                    for k, predicted, replay in zip(wide.metric, wide.ensemble, wide.single)]
    return wide.groupby(["seed", "num_requests", "speed"]).miss.sum().rename("misses").reset_index()


def setup_overrides(text: str) -> dict:
    """--set's KEY=VALUE pairs as `deploy_check.Setup` fields of their own types (the size and the load
    have options of their own)."""
    fields = {f: type(getattr(dc.FULL, f)) for f in dc.Setup.__dataclass_fields__
              if f not in ("grid", "num_requests", "load")}
    out = {}
    for pair in filter(None, text.split(",")):
        key, _, value = pair.partition("=")
        if key not in fields:
            raise SystemExit(f"--set: {key!r} is no field of deploy_check.Setup; expected one of {sorted(fields)}")
        try:
            out[key] = fields[key](value)
        except ValueError:
            raise SystemExit(f"--set: {key}={value!r}: expected a value of type {fields[key].__name__}") from None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python experiments/deploy_slice_size.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="run", type=Path, required=True, help="a deploy_check.py output folder")
    p.add_argument("--sizes", default=f"36,{dc.FULL.num_requests}", help="slice sizes, comma-separated")
    p.add_argument("--seeds", default="0,1", help="seeds of the groups' draw, comma-separated")
    p.add_argument("--load", type=float, default=dc.FULL.load, help="offered rate over the predicted capacity")
    p.add_argument("--set", default="", help="other fields of the setup, KEY=VALUE,... (e.g. num_gpu_blocks=96)")
    args = p.parse_args(argv)
    dc.check_run(args.run, p)
    base = replace(dc.FULL, **setup_overrides(args.set))
    frame = sweep(args.run, [int(x) for x in args.sizes.split(",")], [int(x) for x in args.seeds.split(",")],
                  args.load, base)
    table = jitter(frame)
    worst = table.groupby(["way", "num_requests", "router", "metric"], sort=False).jitter.max()
    elasticity = table[table.way == "ensemble"].groupby(["num_requests", "metric"], sort=False).elasticity.median()
    spans = frame.groupby(["seed", "num_requests"]).span_s.first()
    with pd.option_context("display.width", 200, "display.float_format", lambda v: f"{v:.3f}"):
        print(f"load {args.load}: jitter, the largest distance from the line through a metric's values at step times "
              f"x{min(SPEEDS)}-x{max(SPEEDS)} (relative; hit rate absolute), worst over seeds {args.seeds}")
        print(worst.unstack("metric")[list(METRICS)].to_string())
        print("elasticity of the prediction (ensemble): the line's relative move per relative change of step time, "
              "median over routers and seeds")
        print(elasticity.unstack("metric")[list(METRICS)].to_string())
        passed = misses(frame).groupby("num_requests").misses.agg(
            checks="size", passed=lambda m: int((m == 0).sum()), misses_per_check="mean")
        print("a replay exactly as simulated (one simulation at each speed, each seed) against the prediction at its "
              "speed: checks passed (every metric within goal), and judged metrics missed per check")
        print(passed.to_string())
        print("arrival span (s):", ", ".join(f"seed {s} n={n}: {v:.0f}" for (s, n), v in spans.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
