"""Cache-aware routing on multi-turn traffic: how much of the reachable prefix reuse each router
catches, and at what latency.

The yardstick is one LRU cache as large as all replicas' caches together, over the trace in
arrival order (`paged.workloads.prefix_reuse`): a router that kept every request where its
prefix lives could catch about that much. `prefix_aware` guesses where prefixes live from its
own routing record; `kv_aware` reads the replicas' KV events (blocks stored and evicted), so it
knows what each replica still holds, and weighs that against load.

Setup: Llama-3.1-8B on 4 H100 replicas, block size 16, FCFS, each replica's KV cache cut (16,384
blocks for Mooncake, 2,048 for the conversations, against about 29,000 that an H100 leaves) so
that each trace's working set overflows one replica's cache, which is where routing matters.
Traces: the repository's Mooncake trace (arrivals stretched 2x), and two synthetic conversation
traces (`paged.workloads.conversations`): chat (short turns, long think times) and agentic (a
long system prompt, many quick turns).
"""
from __future__ import annotations

import sys
from dataclasses import replace

import pandas as pd
from common import MOONCAKE, Verdict, outcome, percent, run_table_experiment

from paged.serve.router import RouterConfig
from paged.workloads.conversations import ConversationShape, conversation_workload
from paged.workloads.prefix_reuse import pooled_lru_hit_rate
from sim import SimConfig, get_model, load_workload, simulate
from sim.plots import figure, legend_below, look, plain_log

NAME = "cache_aware_routing"
CONFIG = SimConfig(model="llama-3.1-8b", hardware="h100", replicas=4)
HATCHES = ("", "//", "..", "xx", "\\\\")  # greyscale tells the routers' bars apart too
ROUTERS = ("round_robin", "least_outstanding", "prefix_aware", "kv_aware")
# kv_aware as `paged router` runs it: the replicas' KV events read every READS_S (0.25 s), not as they happen
READS_S = RouterConfig([]).kv_events_interval_s
POLLED = f"kv_aware (events read every {READS_S:g} s)"
CHAT = ConversationShape(num_conversations=800, rate=1.0, mean_turns=6, think_time_s=30, system_prompt_tokens=512,
                         user_tokens=150, output_tokens=300, max_model_len=16384)
AGENTIC = ConversationShape(num_conversations=300, rate=0.4, mean_turns=15, think_time_s=8,
                            system_prompt_tokens=2048, user_tokens=400, output_tokens=150, max_model_len=32768)


def traces(quick: bool) -> dict:
    """name -> (workload, KV blocks per replica)"""
    def shrink(shape: ConversationShape) -> ConversationShape:
        return replace(shape, num_conversations=shape.num_conversations // 8) if quick else shape

    mooncake = load_workload(MOONCAKE, num_requests=400 if quick else None, time_scale=2.0,
                             max_model_len=get_model(CONFIG.model).max_model_len)
    return {"mooncake": (mooncake, 16384),
            "chat": (conversation_workload(shrink(CHAT), seed=1, name="chat"), 2048),
            "agentic": (conversation_workload(shrink(AGENTIC), seed=2, name="agentic"), 2048)}


def run(workload, router: str, blocks: int, config: SimConfig = CONFIG) -> dict:
    polled = {"router": "kv_aware", "kv_events_interval_s": READS_S}
    result = simulate(workload, config, **(polled if router == POLLED else {"router": router}), num_gpu_blocks=blocks)
    s, req = result.summary(), result.requests
    return {"router": router, "hit_rate": req.prefix_hit_tokens.sum() / req.num_prompt_tokens.sum(),
            "ttft_s_p50": s["ttft_s"]["p50"], "ttft_s_p99": s["ttft_s"]["p99"], "tpot_s_p99": s["tpot_s"]["p99"],
            "num_preemptions": s["num_preemptions"], "num_finished": s["num_finished"]}


def table(quick: bool) -> pd.DataFrame:
    rows = []
    for name, (w, blocks) in traces(quick).items():
        bound = pooled_lru_hit_rate(w, blocks * CONFIG.replicas, CONFIG.block_size)
        for router in (*ROUTERS, POLLED):  # a line as each run starts: the whole takes minutes
            print(f"{name}, {len(w):,} requests: {router} ...", file=sys.stderr, flush=True)
            rows.append({"trace": name, "num_requests": len(w), "cache_blocks_per_replica": blocks,
                         **run(w, router, blocks), "yardstick": bound})
    df = pd.DataFrame(rows)
    df["ratio"] = df.hit_rate / df.yardstick
    return df


def plot(df: pd.DataFrame):
    fig, axes = figure(1, 2)
    names = list(dict.fromkeys(df.trace))
    routers = list(dict.fromkeys(df.router))
    width = 0.8 / len(routers)
    for k, router in enumerate(routers):
        d = df[df.router == router].set_index("trace").loc[names]
        xs = [i + (k - (len(routers) - 1) / 2) * width for i in range(len(names))]
        style = {"color": look(k)["color"], "hatch": HATCHES[k % len(HATCHES)], "edgecolor": "white"}
        axes[0, 0].bar(xs, 100 * d.ratio, width, label=router, **style)
        axes[0, 1].bar(xs, d.ttft_s_p99, width, label=router, **style)
    axes[0, 0].axhline(85, color="grey", ls="--", lw=0.8, label="85% of the yardstick")
    axes[0, 0].set_ylabel("prefix hit rate, % of the yardstick")
    axes[0, 0].set_title("hit rate / one pooled LRU cache")
    axes[0, 1].set_ylabel("TTFT p99 (s)")
    axes[0, 1].set_yscale("log")
    plain_log(axes[0, 1].yaxis)
    axes[0, 1].set_title("time to first token, p99")
    for ax in axes[0]:
        ax.set_xticks(range(len(names)), names)
    fig.suptitle(f"{CONFIG.model} on {CONFIG.replicas} x {CONFIG.hardware}: routers on multi-turn traces")
    legend_below(fig, axes, ncol=3)
    return fig


def verdicts(df: pd.DataFrame) -> list[Verdict]:
    kv = df[df.router == "kv_aware"].set_index("trace")
    polled = df[df.router == POLLED].set_index("trace")
    lo = df[df.router == "least_outstanding"].set_index("trace")
    hit_ok = bool((kv.ratio >= 0.85).all() and (polled.ratio >= 0.85).all())
    ttft_ok = bool((kv.ttft_s_p99 <= lo.ttft_s_p99.loc[kv.index]).all()
                   and (polled.ttft_s_p99 <= lo.ttft_s_p99.loc[polled.index]).all())
    evidence = "; ".join(f"{t}: {percent(r.ratio)} of {percent(r.yardstick)} (prefix_aware "
                         f"{percent(df[(df.trace == t) & (df.router == 'prefix_aware')].ratio.iloc[0])}), TTFT p99 "
                         f"{r.ttft_s_p99:.2f} s vs {lo.ttft_s_p99[t]:.2f} s least_outstanding"
                         for t, r in kv.iterrows())
    evidence += "; " + "; ".join(f"{t} with events read every {READS_S:g} s: "
                                 f"{percent(r.ratio)}, TTFT p99 {r.ttft_s_p99:.2f} s" for t, r in polled.iterrows())
    worst = min(kv.ratio.min(), polled.ratio.min())
    headline = (f"kv_aware: at worst {percent(worst)} of the yardstick; TTFT p99 "
                + ("no worse than" if ttft_ok else "worse than") + " least_outstanding on every trace")
    return [Verdict("kv_aware reaches 85% of the pooled-LRU yardstick on every trace, with TTFT p99 no worse "
                    "than least_outstanding, also reading the replicas' KV events late as the real router does",
                    outcome(hit_ok and ttft_ok, hit_ok or ttft_ok), headline, evidence)]


def main(argv: list[str] | None = None) -> int:
    return run_table_experiment(NAME, __doc__, argv, table, plot, verdicts)


if __name__ == "__main__":
    sys.exit(main())
