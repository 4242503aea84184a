"""A finished `deploy_check.py` run, predicted again in hindsight: each router's replay simulated with
that replay's own served step speed (`served_steps.served_speed` of its steps, as its drift records it)
instead of the calibration's. A diagnostic, never the check's prediction: a miss that the hindsight
prediction still makes is the model's (routing, caching, the front end); one it does not make was
the machine running off the calibration during that replay.

    python experiments/deploy_hindsight.py DIR

DIR is the run's --out (deploy_check.json; the profile it names, or DIR/profile.json where that has
moved with DIR). The run's own prediction is recomputed first from the calibration and must come out
the same, so both rest on the same workload and config.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import deploy_check as dc
import numpy as np
import served_steps
from common import at_load
from served_steps import ServedSpeed

from sim import SimConfig
from sim.profiled import fit_profile


def hindsight(run: Path) -> dict[str, dict[str, float]]:
    """Per router, each judged metric's error (relative; absolute for the hit rate) when predicted
    with the replay's own step speed."""
    doc = json.loads((run / "deploy_check.json").read_text())
    fit = fit_profile(dc.run_profile(run, doc))
    setup = replace(dc.FULL, **{k: v for k, v in doc["conditions"]["setup"].items() if k != "grid"})
    workload = at_load(dc.shared_prefix_slice(setup), doc["conditions"]["offered_req_s"])
    base = SimConfig(model=dc.MODEL, cost_model=served_steps.served_cost_model(fit, ServedSpeed()),
                     num_gpu_blocks=setup.num_gpu_blocks, block_size=dc.BLOCK_SIZE, max_num_seqs=setup.max_num_seqs,
                     max_num_batched_tokens=setup.max_num_batched_tokens, max_model_len=setup.max_model_len,
                     replicas=dc.REPLICAS)
    out = {}
    for router, d in doc["routers"].items():
        drift = d["drift"]
        config = replace(base, **dc.routed_as_launched(router, d["frontend_latency_s"]))
        again = dc.predict(workload, config, fit, ServedSpeed(**drift["assumed"]))
        if not np.isclose(again["ttft_s_mean"], d["metrics"]["ttft_s_mean"]["predicted"], rtol=1e-9):
            raise RuntimeError(f"{run}: {router}'s prediction recomputed to {again['ttft_s_mean']!r} s mean TTFT, the "
                               f"run predicted {d['metrics']['ttft_s_mean']['predicted']!r}: not the same setup")
        late = dc.predict(workload, config, fit, ServedSpeed(**drift["served"]))
        out[router] = {k: dc.rel_error(k, late[k], m["measured"]) for k, m in d["metrics"].items()
                       if not np.isnan(dc.goal(k))}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python experiments/deploy_hindsight.py", description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="a deploy_check.py output folder")
    errors = hindsight(dc.check_run(p.parse_args(argv).run, p))
    within = 0
    for router, e in errors.items():
        ok = {k: abs(v) <= dc.goal(k) for k, v in e.items()}
        within += sum(ok.values())
        print(f"hindsight {router}: " + ", ".join(f"{k} {v:+.3f}{'' if ok[k] else ' (miss)'}" for k, v in e.items()))
    print(f"hindsight: {within} of {sum(len(e) for e in errors.values())} within their goal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
