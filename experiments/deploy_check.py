"""Simulate, then deploy, at the size of a deployment: do 2 replicas behind a router do what the
simulator predicted, for each router?

The loop, closed at the cluster level: (1) profile one engine's step times (`paged.engine.profile`, one
thread: each replica has a core of its own here); (2)
take a slice of the Azure conversation trace (lengths scaled down), give every prompt one of a few
shared system prompts (a shared-prefix structure, so routing decides prefix-cache hits), and
rescale its arrivals to a fraction of the capacity the profile predicts for 2 replicas; (3)
simulate the slice on 2 replicas behind each of round_robin, least_outstanding and prefix_aware,
with the replicas' own cache and scheduler configs; (4) launch the real replicas and router
(`paged launch`) for each router and replay the slice with the load generator (`paged bench
serve`'s replay: prompts are token ids whose shared-prefix blocks are the same tokens, outputs
exactly their trace length, sent open-loop at their arrival times); (5) compare TTFT, TPOT, E2E
(means and p50), throughput and the prefix-cache hit rate (from the replicas' own
`vllm:prefix_cache_*` counters), and whether the routers rank the same way predicted and
measured. Goal: means and p50 within 10%, hit rate within 0.03, the same ranking.

Writes DIR/deploy_check.json as {"routers": {name: {"metrics": {metric: {"predicted", "measured",
"rel_error"}}}}, "ranking": ..., "conditions": ...}, a CSV, a figure and the verdicts. As in
`sim_vs_real.py`, the profile's shapes are re-measured afterwards and the ratio printed: on a
shared machine the speed moves, and that bounds what any prediction can do.

Options besides --out and --quick: --profile PATH reuses a profile; --num-requests N sizes the slice;
--routers a,b checks only those.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import torch
from common import (
    Verdict,
    at_load,
    azure_conv,
    outcome,
    parse_args,
    report,
    saturation_throughput,
    write_csv,
    write_png,
)
from sim_vs_real import drift, sim_config

from paged.engine import EngineConfig, LLMEngine
from paged.engine.profile import ProfileGrid, profile, write_profile
from paged.serve.bench_serve import first_model, summarize
from paged.serve.prompts import PromptMaker
from paged.serve.replay import replay
from paged.serve.scrape import Scrape
from paged.serve.server_process import free_port
from paged.workloads.workload import Workload
from sim import simulate
from sim.plots import figure, legend_below, look

NAME = "deploy_check"
MODEL = "smollm2-135m"
ROUTERS = ("round_robin", "least_outstanding", "prefix_aware")
REPLICAS = 2  # this machine has 2 cores: one engine thread each
BLOCK_SIZE = 16  # the engines' KV block, and the tokens per prefix id in the simulator
MIN_TOKEN_ID = 1000  # prompts' token ids start above the vocabulary's special tokens (as bench serve's)
GOAL, HIT_RATE_GOAL = 0.10, 0.03
LATENCIES = ("ttft_s", "tpot_s", "e2e_s")
RANK_BY = "e2e_s_mean"
ROOT = Path(__file__).resolve().parent.parent


@dataclass(slots=True)
class Setup:
    num_requests: int
    prompt_scale: float  # the request's own tokens: trace length times this, rounded, in [1, max_own_tokens]
    output_scale: float
    max_own_tokens: int
    max_output_tokens: int
    prefix_tokens: int  # the shared system prompt in front of every prompt
    num_groups: int  # how many different system prompts
    load: float  # offered rate as a fraction of the 2 replicas' predicted capacity
    max_num_seqs: int
    max_num_batched_tokens: int
    num_gpu_blocks: int  # per replica: small enough that the prefixes compete for it
    grid: ProfileGrid

    @property
    def max_model_len(self) -> int:
        return self.prefix_tokens + self.max_own_tokens + self.max_output_tokens


# Four system prompts of 96 tokens in front of prompts an eighth of the trace's: each replica's 160
# blocks of 16 tokens hold two or three groups' prefixes beside the running requests, so a router
# that keeps a group on one replica hits where one that spreads groups misses. 60% of the predicted
# capacity keeps the replicas busy without a queue that never drains.
FULL = Setup(num_requests=48, prompt_scale=1 / 8, output_scale=1 / 4, max_own_tokens=160, max_output_tokens=64,
             prefix_tokens=96, num_groups=4, load=0.6, max_num_seqs=8, max_num_batched_tokens=256,
             num_gpu_blocks=160,
             grid=ProfileGrid(prefill_chunks=(16, 64, 128, 256), prefill_contexts=(0, 96),
                              decode_batches=tuple(range(1, 9)), decode_contexts=(128, 300),
                              mixed_batches=(1, 2, 4, 8), mixed_chunks=(32, 128), mixed_context=160, repeats=3))
QUICK = Setup(num_requests=6, prompt_scale=1 / 16, output_scale=1 / 16, max_own_tokens=32, max_output_tokens=6,
              prefix_tokens=32, num_groups=2, load=0.6, max_num_seqs=4, max_num_batched_tokens=64, num_gpu_blocks=64,
              grid=ProfileGrid(prefill_chunks=(16, 64), prefill_contexts=(0,), decode_batches=(1, 2, 4),
                               decode_contexts=(48,), mixed_batches=(2,), mixed_chunks=(16,), mixed_context=32,
                               repeats=1))


def shared_prefix_slice(setup: Setup) -> Workload:
    """The trace's first requests, lengths scaled and capped, each behind one of `num_groups`
    system prompts (round robin), named by one prefix id per block as the simulator reads them."""
    w = azure_conv(setup.num_requests, MODEL)
    block = BLOCK_SIZE
    own = np.clip(np.round(w.num_prompt_tokens * setup.prompt_scale), 1, setup.max_own_tokens).astype(np.int64)
    out = np.clip(np.round(w.num_output_tokens * setup.output_scale), 1, setup.max_output_tokens).astype(np.int64)
    ids_per_group = setup.prefix_tokens // block
    return replace(w, num_prompt_tokens=setup.prefix_tokens + own, num_output_tokens=out,
                   prefix_index=np.arange(len(w), dtype=np.int64) % setup.num_groups,
                   prefix_values=np.arange(setup.num_groups * ids_per_group, dtype=np.int64),
                   prefix_offsets=np.arange(setup.num_groups + 1, dtype=np.int64) * ids_per_group,
                   hash_id_block_size=block, name=f"{w.name} behind {setup.num_groups} system prompts")


def engine_options(setup: Setup) -> dict:
    """Each replica's engine settings (also the in-process engine the profile runs on)."""
    return {"block_size": BLOCK_SIZE, "max_num_seqs": setup.max_num_seqs,
            "max_num_batched_tokens": setup.max_num_batched_tokens, "max_model_len": setup.max_model_len,
            "num_gpu_blocks": setup.num_gpu_blocks, "threads": 1}


def flags(options: dict) -> list[str]:
    return [x for k, v in options.items() for x in (f"--{k.replace('_', '-')}", str(v))]


@contextmanager
def launched(router: str, setup: Setup, log_dir: Path, replicas: int = REPLICAS):
    """`paged launch` of `replicas` engines and the router: (router URL, replica URLs); always stopped."""
    port = free_port()
    cmd = [sys.executable, "-m", "paged", "launch", "--model", MODEL, "--replicas", str(replicas), "--router", router,
           "--port", str(port), "--log-dir", str(log_dir), *flags(engine_options(setup)), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        urls = []
        for line in proc.stdout:  # the launcher names each replica, then the router once all are healthy
            if m := re.match(r"replica \d+: pid \d+ at (\S+)", line):
                urls.append(m.group(1))
            if line.startswith("router:"):
                break
        else:
            raise RuntimeError(f"paged launch exited with {proc.wait()}: see {log_dir}")
        yield f"http://127.0.0.1:{port}", urls
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def prefix_counters(urls: list[str]) -> np.ndarray:
    """(queries, hits) of the prefix cache, summed over the replicas' /metrics."""
    total = np.zeros(2)
    for url in urls:
        scrape = Scrape(httpx.get(f"{url}/metrics", timeout=10).text)
        total += [scrape.value(name) or 0.0 for name in ("vllm:prefix_cache_queries_total",
                                                         "vllm:prefix_cache_hits_total")]
    return total


def measure(router: str, setup: Setup, workload: Workload, vocab: int, log_dir: Path, replicas: int = REPLICAS) -> dict:
    """The workload replayed against `replicas` real engines behind `router`: bench serve's
    summary, with the hit rate the replicas counted."""
    with launched(router, setup, log_dir, replicas) as (url, urls):
        prompts = PromptMaker(workload, vocab_size=vocab, min_token_id=MIN_TOKEN_ID)
        before = prefix_counters(urls)
        records, wall = asyncio.run(replay(url, first_model(url), workload, prompts))
        queries, hits = prefix_counters(urls) - before
    summary = summarize(workload, records, wall)
    summary["prefix_cache_hit_rate"] = hits / queries if queries else float("nan")
    return summary


def flat(summary: dict) -> dict[str, float]:
    out = {f"{k}_{q}": summary[k][q] for k in LATENCIES for q in ("mean", "p50", "p90")}
    out["throughput_req_s"] = summary["throughput_req_s"]
    out["prefix_cache_hit_rate"] = summary["prefix_cache_hit_rate"]
    return out


def compare(predicted: dict, measured: dict) -> dict:
    p, m = flat(predicted), flat(measured)
    return {k: {"predicted": p[k], "measured": m[k],
                "rel_error": (p[k] - m[k]) / m[k] if k != "prefix_cache_hit_rate" else p[k] - m[k]} for k in p}


def goal_rows(routers: dict) -> pd.DataFrame:
    rows = [{"router": r, "metric": k, **v} for r, d in routers.items() for k, v in d["metrics"].items()]
    table = pd.DataFrame(rows)
    judged = table.metric.str.endswith(("_mean", "_p50")) | (table.metric == "throughput_req_s")
    table["goal"] = np.where(table.metric == "prefix_cache_hit_rate", HIT_RATE_GOAL, np.where(judged, GOAL, np.nan))
    table["within"] = table.rel_error.abs() <= table.goal
    return table


def ranking(routers: dict, side: str) -> list[str]:
    """Routers from best to worst by RANK_BY."""
    return sorted(routers, key=lambda r: routers[r]["metrics"][RANK_BY][side])


def verdicts(table: pd.DataFrame, routers: dict) -> list[Verdict]:
    judged = table[table.goal.notna()]
    misses = judged[~judged.within]
    same = ranking(routers, "predicted") == ranking(routers, "measured")
    text = (f"{int(judged.within.sum())} of {len(judged)} within their goal (latency means and p50 and throughput "
            f"{GOAL:.0%}, hit rate {HIT_RATE_GOAL} absolute)"
            + (f"; misses: {', '.join(f'{r.router} {r.metric} {r.rel_error:+.3g}' for r in misses.itertuples())}"
               if len(misses) else "")
            + f". Routers by {RANK_BY}: predicted {' < '.join(ranking(routers, 'predicted'))}, measured "
            f"{' < '.join(ranking(routers, 'measured'))}.")
    claim = (f"{REPLICAS} replicas behind each of {', '.join(routers)}: the simulator predicts the deployment within "
             f"{GOAL:.0%} and ranks the routers as measured")
    headline = (f"{int(judged.within.sum())} of {len(judged)} predictions within their goal; routers ranked "
                + ("as measured" if same else "unlike the measurement"))
    return [Verdict(claim, outcome(not len(misses) and same, partly=same or judged.within.any()), headline, text)]


def plot(table: pd.DataFrame, names: list[str], title: str):
    metrics = ["ttft_s_mean", "tpot_s_mean", "e2e_s_mean", "throughput_req_s", "prefix_cache_hit_rate"]
    fig, axes = figure(1, len(metrics), width=1.45, height=2.4)  # a page's width
    x = np.arange(len(names))
    for ax, metric in zip(axes[0], metrics, strict=True):
        d = table[table.metric == metric].set_index("router").loc[names]
        ax.bar(x - 0.2, d.predicted, 0.4, color=look("predicted")["color"], label="predicted")
        ax.bar(x + 0.2, d.measured, 0.4, color=look("measured")["color"], hatch="//", edgecolor="white",
               label="measured")
        ax.set_xticks(x, [r.replace("_", "\n") for r in names], fontsize=7)
        ax.set_title(metric, fontsize=9)
    legend_below(fig, axes, ncol=2)
    fig.suptitle(title)
    return fig


def run(args: argparse.Namespace, setup: Setup) -> int:
    started = time.perf_counter()
    engine = LLMEngine(EngineConfig(model=MODEL, **engine_options(setup)))
    profile_path = args.profile or args.out / "profile.json"
    if args.profile is None:  # measured alone: one thread, as each replica will run on its own core
        write_profile(profile(engine, setup.grid), str(profile_path))
    before_profile = json.loads(Path(profile_path).read_text())
    config = replace(sim_config(engine, profile_path), replicas=REPLICAS)
    trace = shared_prefix_slice(setup)
    capacity = saturation_throughput(trace, config)
    workload = at_load(trace, setup.load * capacity)
    vocab = engine.model_config.vocab_size
    routers, timings = {}, {}
    for router in args.routers:
        predicted = simulate(workload, replace(config, router=router)).summary()
        t = time.perf_counter()
        measured = measure(router, setup, workload, vocab, args.out / f"logs-{router}")
        timings[router] = time.perf_counter() - t
        if measured["num_finished"] != len(workload):
            raise RuntimeError(f"{router}: {measured['num_finished']} of {len(workload)} requests finished "
                               f"({measured.get('errors')}); logs in {args.out / f'logs-{router}'}")
        routers[router] = {"metrics": compare(predicted, measured),
                           "ranks_by": RANK_BY, "num_steps_predicted": predicted["num_steps"],
                           "send_lateness_p99_s": measured["send_lateness_s"]["p99"]}
        print(f"{router}: replayed in {timings[router]:.0f} s", flush=True)
    slower = drift(before_profile, profile(engine, setup.grid))
    table = goal_rows(routers)
    doc = {"routers": routers,
           "ranking": {"by": RANK_BY, "predicted": ranking(routers, "predicted"),
                       "measured": ranking(routers, "measured")},
           "conditions": {"model": MODEL, "replicas": REPLICAS, "setup": asdict(setup), "profile": str(profile_path),
                          "num_requests": len(workload), "offered_req_s": setup.load * capacity,
                          "capacity_req_s_predicted": capacity, "replay_wall_s": timings,
                          "profile_after_replay_over_before": slower}}
    (args.out / f"{NAME}.json").write_text(json.dumps(doc, indent=1, default=float) + "\n")
    title = (f"Predicted vs measured: {len(workload)} Azure conv requests behind {setup.num_groups} system prompts, "
             f"{REPLICAS} x {MODEL} at {setup.load * capacity:.2f} req/s")
    figure_path = write_png(plot(table, list(routers), title), args.out, NAME)
    files = [args.out / f"{NAME}.json", write_csv(table, args.out, NAME), figure_path]
    with pd.option_context("display.width", 160, "display.float_format", lambda v: f"{v:.4g}"):
        print(table.to_string(index=False))
    moved = ", ".join(f"x{v:.3f} ({kind})" for kind, v in slower.items())
    print(f"the profile's shapes, re-measured after the replays, took {moved or '(no shape in common)'} their time "
          "in the profile")
    report(verdicts(table, routers), args.out, files)
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", type=Path, default=None, help="reuse this profile instead of measuring one")
    p.add_argument("--num-requests", type=int, default=None, help="size of the slice (default: the setup's)")
    p.add_argument("--routers", default=",".join(ROUTERS), help="comma-separated, from paged.core.routing")


def main(argv: list[str] | None = None) -> int:
    paragraphs = __doc__.split("\n\n")
    args = parse_args(NAME, f"{paragraphs[0]} {paragraphs[-1]}", argv, add_options)
    args.routers = [r for r in args.routers.split(",") if r]
    setup = QUICK if args.quick else FULL
    if args.num_requests:
        setup = replace(setup, num_requests=args.num_requests)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run(args, setup)
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    sys.exit(main())
