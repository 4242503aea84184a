"""Routing probes: the setups beyond `cache_aware_routing.py`'s three traces where issue 11's goal
was tested, kv_aware at 85% or more of the pooled-LRU yardstick on every trace tried, with TTFT p99
no worse than least_outstanding's. A change to kv_aware is judged on these too, so they are a
script, not snippets: each row is one probe, both routers on the same workload and replicas, flagged
where kv_aware misses either half of the goal.

Probes (Llama-3.1-8B, block size 16, FCFS; the yardstick and `run` are `cache_aware_routing`'s):
- Mooncake past saturation: windows of 400 requests from request 400, 1,200 and 2,400 of the
  repository's Mooncake trace, at 2.5x, 3x and 3.5x its rate on 2 A100s and 5x, 6x and 7x on 4, with
  the KV cache memory leaves. Prompts are capped by a 4,096-token context (`cap_lengths`) and their
  hash ids trimmed to the tokens kept: `cap_lengths` keeps every id, which would make kv_aware count
  blocks in flight that no replica will store.
- Agentic turns with an 8k-token system prompt (`cache_aware_routing.AGENTIC`, 8,192 system prompt
  tokens) on 8 H200s of 2,048 blocks: turns of 10-30k tokens, two of which fill a replica.
- Agentic bursts on 8 H200s of 2,048 blocks: 20 bursts, at exponential gaps of mean 20 s from 0, of
  16 `AGENTIC` conversations that start together and share a 2,048-token prefix of their own.
Both conversation probes run seeds 11, 21, 31, 41 and 51.
- Long conversations as Mooncake's traces name them (`LONG_CONVERSATIONS`: 1,000 conversations of 12
  turns on average, prompts of 9.3k tokens on average, 350-token answers; ids per 512 tokens, as
  Mooncake's hash ids), seed 11, on 8 H200s with the KV cache the memory leaves (57,314 blocks) and
  with 6,000 blocks, where the working set overflows: the kind of trace on which issue 11 saw
  prefix_aware reach 47% of the yardstick.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from cache_aware_routing import AGENTIC, run
from common import MOONCAKE, Verdict, outcome, parse_args, percent, report, write_csv

from paged.output_paths import check_output_paths
from paged.workloads.conversations import ConversationShape, conversation_workload
from paged.workloads.prefix_reuse import pooled_lru_hit_rate
from paged.workloads.workload import packed_ids
from sim import SimConfig, Workload, get_hardware, get_model, load_workload, plan_kv_cache

NAME = "routing_probes"
ROUTERS = ("kv_aware", "least_outstanding")
GOAL = 0.85  # of the yardstick
MODEL = "llama-3.1-8b"
CONTEXT = 4096  # Mooncake's prompts capped as by a 4k-context model
WINDOW = 400  # Mooncake requests per probe
STARTS = (400, 1200, 2400)  # the windows' first requests
QUICK_START, QUICK_WINDOW = 1200, 100  # --quick: one window, where a pooled cache hits some
RATES = {2: (2.5, 3.0, 3.5), 4: (5.0, 6.0, 7.0)}  # replicas -> multiples of the trace's rate
SEEDS = (11, 21, 31, 41, 51)
H200_BLOCKS = 2048  # per replica: the conversations' working set overflows the caches
LONG_CONVERSATIONS = ConversationShape(num_conversations=1000, rate=0.3, mean_turns=12, think_time_s=60,
                                       system_prompt_tokens=1024, user_tokens=900, output_tokens=350,
                                       max_model_len=65536)
MOONCAKE_ID_TOKENS = 512  # tokens per hash id in Mooncake's traces
TIGHT_H200_BLOCKS = 6000  # per replica: the long conversations' working set overflows the caches
BURSTS, BURST_SIZE, BURST_GAP_S = 20, 16, 20.0


def trimmed(w: Workload, context: int) -> Workload:
    """`w.cap_lengths(context)`, each request's hash ids cut to those naming the prompt it keeps."""
    w = w.cap_lengths(context)
    per = w.hash_id_block_size
    index, values, offsets = packed_ids([(w.prefix_ids(i) or [])[:-(-int(p) // per)]
                                         for i, p in enumerate(w.num_prompt_tokens)])
    return replace(w, prefix_index=index, prefix_values=values, prefix_offsets=offsets)


def mooncake_window(trace: Workload, start: int, n: int, speedup: float) -> Workload:
    """Requests start..start+n-1 of the trace (by their arrival times), `speedup` times as fast."""
    end = trace.arrival_s[start + n] if start + n < len(trace) else np.inf
    return trimmed(trace.window(trace.arrival_s[start], end).scale_time(1 / speedup), CONTEXT)


def bursts(seed: int, num_bursts: int, size: int) -> Workload:
    """`num_bursts` bursts of `size` `AGENTIC` conversations starting together (each burst
    `conversation_workload` at rate 1e6, seed 1000 x seed + burst), each with a system prompt of its
    own (its ids shifted past the previous burst's), at exponential gaps of mean BURST_GAP_S from 0 (the
    first burst; gaps drawn from `default_rng(seed)`)."""
    starts = np.concatenate(([0.0], np.cumsum(np.random.default_rng(seed).exponential(BURST_GAP_S, num_bursts - 1))))
    parts = [conversation_workload(replace(AGENTIC, num_conversations=size, rate=1e6), seed=1000 * seed + b)
             for b in range(num_bursts)]
    id_shift = np.cumsum([0] + [int(p.prefix_values.max()) + 1 for p in parts[:-1]])
    seq_shift = np.cumsum([0] + [len(p.prefix_offsets) - 1 for p in parts[:-1]])
    value_shift = np.cumsum([0] + [len(p.prefix_values) for p in parts[:-1]])
    arrival = np.concatenate([p.arrival_s + t for p, t in zip(parts, starts)])
    order = np.argsort(arrival, kind="stable")

    def joined(col):
        return np.concatenate([getattr(p, col) for p in parts])[order]

    offsets = np.concatenate([[0]] + [p.prefix_offsets[1:] + s for p, s in zip(parts, value_shift)])
    return Workload(arrival[order], joined("num_prompt_tokens"), joined("num_output_tokens"),
                    prefix_index=np.concatenate([p.prefix_index + s for p, s in zip(parts, seq_shift)])[order],
                    prefix_values=np.concatenate([p.prefix_values + s for p, s in zip(parts, id_shift)]),
                    prefix_offsets=offsets, hash_id_block_size=parts[0].hash_id_block_size, ids_cover_output=True,
                    name=f"agentic bursts, seed {seed}")


def probes(quick: bool):
    """(name, workload, config, KV blocks per replica) of each probe, built as it is reached."""
    trace = load_workload(MOONCAKE, num_requests=QUICK_START + QUICK_WINDOW + 1 if quick else None)
    for replicas, rates in RATES.items():
        config = SimConfig(model=MODEL, hardware="a100-80gb", replicas=replicas)
        blocks = plan_kv_cache(get_model(MODEL), get_hardware(config.hardware)).num_gpu_blocks
        for start in (QUICK_START,) if quick else STARTS:
            for x in rates[:1] if quick else rates:
                yield (f"mooncake x{x:g} {replicas}xA100 from {start}",
                       mooncake_window(trace, start, QUICK_WINDOW if quick else WINDOW, x), config, blocks)
    h200 = SimConfig(model=MODEL, hardware="h200", replicas=8)
    system_8k = replace(AGENTIC, system_prompt_tokens=8192)
    system_8k = replace(system_8k, num_conversations=16) if quick else system_8k
    for seed in SEEDS[:1] if quick else SEEDS:
        yield f"agentic 8k prompt 8xH200 seed {seed}", conversation_workload(system_8k, seed=seed), h200, H200_BLOCKS
    for seed in SEEDS[:1] if quick else SEEDS:
        w = bursts(seed, 3 if quick else BURSTS, 4 if quick else BURST_SIZE)
        yield f"agentic bursts 8xH200 seed {seed}", w, h200, H200_BLOCKS
    long = replace(LONG_CONVERSATIONS, num_conversations=20) if quick else LONG_CONVERSATIONS
    w = conversation_workload(long, seed=SEEDS[0], block_size=MOONCAKE_ID_TOKENS)
    roomy = plan_kv_cache(get_model(MODEL), get_hardware(h200.hardware)).num_gpu_blocks
    for blocks in (TIGHT_H200_BLOCKS,) if quick else (roomy, TIGHT_H200_BLOCKS):
        yield f"long conversations 8xH200 {blocks} blocks", w, h200, blocks


def flag(r: dict) -> str:
    return "; ".join(([f"under {percent(GOAL)}"] if r["kv_aware_ratio"] < GOAL else [])
                     + (["p99 above"] if r["kv_aware_ttft_s_p99"] > r["least_outstanding_ttft_s_p99"] else []))


def table(quick: bool) -> pd.DataFrame:
    rows = []
    for name, w, config, blocks in probes(quick):
        row = {"probe": name, "num_requests": len(w), "replicas": config.replicas, "hardware": config.hardware,
               "cache_blocks_per_replica": blocks,
               "yardstick": pooled_lru_hit_rate(w, blocks * config.replicas, config.block_size)}
        for router in ROUTERS:  # a line as each run starts: the whole takes minutes
            print(f"{name}, {len(w):,} requests: {router} ...", file=sys.stderr, flush=True)
            r = run(w, router, blocks, config)
            row |= {f"{router}_{k}": r[k] for k in ("hit_rate", "ttft_s_p99", "num_finished")}
            row[f"{router}_ratio"] = r["hit_rate"] / row["yardstick"]
        rows.append(row | {"flag": flag(row)})
    return pd.DataFrame(rows)


def verdicts(df: pd.DataFrame) -> list[Verdict]:
    flagged = df[df.flag != ""]
    headline = (f"kv_aware: at worst {percent(df.kv_aware_ratio.min())} of the yardstick; "
                f"{len(flagged)} of {len(df)} probes flagged")
    evidence = "; ".join(f"{r.probe}: {percent(r.kv_aware_ratio)} (least_outstanding "
                         f"{percent(r.least_outstanding_ratio)}), TTFT p99 {r.kv_aware_ttft_s_p99:.3f} s vs "
                         f"{r.least_outstanding_ttft_s_p99:.3f} s" for r in flagged.itertuples()) or "no probe flagged"
    hit_ok, ttft_ok = not flagged.flag.str.contains("under").any(), not flagged.flag.str.contains("p99").any()
    return [Verdict(f"kv_aware reaches {percent(GOAL)} of the pooled-LRU yardstick on every probe, with TTFT p99 no "
                    "worse than least_outstanding", outcome(hit_ok and ttft_ok, hit_ok or ttft_ok), headline,
                    evidence)]


def check_json(path: Path | None) -> None:
    """--json's file, checked before the runs (they take minutes) as every command's outputs are
    (`paged.output_paths`); exit status 2 otherwise."""
    try:
        check_output_paths([("--json", str(path) if path else None, ".json")])
    except ValueError as e:
        print(f"python experiments/{NAME}.py: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", type=Path, metavar="OUT", help="also save the rows to OUT, a JSON list")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(NAME, __doc__.split("\n\n")[0], argv, add_options)
    check_json(args.json)
    df = table(args.quick)
    files = [write_csv(df, args.out, NAME)]
    if args.json is not None:
        args.json.write_text(json.dumps(df.to_dict(orient="records"), indent=1, default=float) + "\n")
        files.append(args.json)
    columns = ["probe", "kv_aware_ratio", "least_outstanding_ratio", "kv_aware_ttft_s_p99",
               "least_outstanding_ttft_s_p99", "flag"]
    print(df[columns].to_string(index=False, formatters={c: "{:.1%}".format for c in columns[1:3]},
                                float_format=lambda x: f"{x:.3f}"))
    report(verdicts(df), args.out, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
