"""What each kv_cache_dtype costs in tokens and buys in room: greedy outputs against the fp16 cache's.

    python -m paged.engine.kv_accuracy [--model smollm2-135m] [--num-prompts 64] [--max-tokens 48] [--json out.json]

Every dtype runs the same prompts, greedy, with the same KV memory budget; the fp16 cache is the
reference (the issue's baseline: what an fp16 server would say). Per dtype:

- capacity: the blocks (and tokens) the budget holds, and their ratio to fp16's;
- token match: over all of fp16's output positions, the fraction where the dtype's token is the
  same (a shorter or longer output counts its missing positions as misses). Past a first
  difference the two continuations are different texts that may still agree here and there, so
  this also counts chance agreement;
- prefix match: over prompts, the mean fraction of fp16's tokens generated before the first
  difference (1.0: identical outputs), which counts no chance agreement;
- identical: the fraction of prompts whose whole output equals fp16's;
- first divergence: over the prompts that differ, the median and smallest index of the first
  differing token.

Greedy decoding turns any change in the logits' top two into a different text from there on, so
these are pessimistic: a changed token is not a wrong one. "auto" (the model's float32 on a CPU)
is measured too, for the size of a difference no quantization made.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from paged import SamplingParams
from paged.help_formatter import ArgumentParser, HelpFormatter

from .cache_engine import KV_CACHE_DTYPES
from .llm import LLM

SUBJECTS = ("the moon", "a lighthouse keeper", "photosynthesis", "the French revolution", "prime numbers",
            "a lost cat", "black holes", "the Python language", "bread baking", "the Roman empire", "volcanoes",
            "a chess match", "honey bees", "the stock market", "an old library", "electric cars")
TEMPLATES = ("Write a short story about {}.", "Explain {} to a ten-year-old.", "List three facts about {}.",
             "What is the most surprising thing about {}?")


def prompts(n: int) -> list[str]:
    """``n`` distinct prompts: every template over every subject, in a fixed order."""
    every = [t.format(s) for s in SUBJECTS for t in TEMPLATES]
    if n > len(every):
        raise ValueError(f"num_prompts={n}: at most {len(every)} distinct prompts")
    return every[:n]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def compare(reference: list[list[int]], outputs: list[list[int]]) -> dict:
    """Agreement of ``outputs`` with ``reference``, prompt by prompt (module docstring)."""
    prefix = [common_prefix(r, o) for r, o in zip(reference, outputs, strict=True)]
    differ = [p for p, r, o in zip(prefix, reference, outputs, strict=True) if r != o]
    same = sum(x == y for r, o in zip(reference, outputs, strict=True) for x, y in zip(r, o, strict=False))
    return {
        "token_match": same / max(sum(map(len, reference)), 1),
        "prefix_match": statistics.fmean(p / max(len(r), 1) for p, r in zip(prefix, reference, strict=True)),
        "identical": 1 - len(differ) / len(reference),
        "first_divergence_median": statistics.median(differ) if differ else None,
        "first_divergence_min": min(differ) if differ else None,
    }


def measure(model: str, dtypes: tuple[str, ...], num_prompts: int, max_tokens: int, kv_cache_memory_bytes: int,
            **engine_kwargs) -> dict:
    """dtype -> capacity and agreement with the "fp16" cache's greedy outputs."""
    texts = prompts(num_prompts)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    results, tokens = {}, {}
    for kv_cache_dtype in ("fp16", *(d for d in dtypes if d != "fp16")):
        llm = LLM(model, kv_cache_dtype=kv_cache_dtype, kv_cache_memory_bytes=kv_cache_memory_bytes, **engine_kwargs)
        tokens[kv_cache_dtype] = [out.token_ids for out in llm.generate(texts, params)]
        blocks = llm.scheduler.cache_config.num_gpu_blocks
        results[kv_cache_dtype] = {"num_gpu_blocks": blocks, "capacity_tokens": blocks * llm.scheduler.block_size,
                                   **compare(tokens["fp16"], tokens[kv_cache_dtype])}
    for r in results.values():
        r["capacity_vs_fp16"] = r["num_gpu_blocks"] / results["fp16"]["num_gpu_blocks"]
    return results


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m paged.engine.kv_accuracy", description=__doc__.split("\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="name or path of the model to use")
    parser.add_argument("--dtypes", default=",".join(KV_CACHE_DTYPES), help="comma-separated kv_cache_dtypes")
    parser.add_argument("--num-prompts", type=int, default=64, help="distinct prompts, each run on every dtype")
    parser.add_argument("--max-tokens", type=int, default=48, help="greedy tokens generated from each prompt")
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=64 << 20,
                        help="size of every dtype's KV cache, in bytes")
    parser.add_argument("--json", help="also write the results here (JSON)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    results = measure(args.model, tuple(args.dtypes.split(",")), args.num_prompts, args.max_tokens,
                      args.kv_cache_memory_bytes)
    print(f"{args.model}, {args.num_prompts} prompts x {args.max_tokens} greedy tokens, "
          f"{args.kv_cache_memory_bytes >> 20} MiB of KV; reference: the fp16 cache")
    print(f"{'kv_cache_dtype':>14} {'blocks':>7} {'tokens':>8} {'x fp16':>7} {'token match':>12} {'prefix match':>13} "
          f"{'identical':>10} {'1st diff median':>16} {'1st diff min':>13}")
    for name, r in results.items():
        median = "-" if r["first_divergence_median"] is None else f"{r['first_divergence_median']:g}"
        first = "-" if r["first_divergence_min"] is None else str(r["first_divergence_min"])
        print(f"{name:>14} {r['num_gpu_blocks']:>7} {r['capacity_tokens']:>8} {r['capacity_vs_fp16']:>7.2f} "
              f"{r['token_match']:>12.1%} {r['prefix_match']:>13.1%} {r['identical']:>10.1%} {median:>16} {first:>13}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "num_prompts": args.num_prompts, "max_tokens": args.max_tokens,
                       "kv_cache_memory_bytes": args.kv_cache_memory_bytes, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
