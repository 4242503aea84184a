"""Command line of the engine.

    python -m paged.engine profile --model smollm2-135m --out profile.json [grid options]
    python -m paged.engine generate --model smollm2-135m --prompt "Hello" [--max-tokens 32]
    python -m paged.engine bench [options]       the engine vs transformers (= paged bench engine)
"""
from __future__ import annotations

import argparse
import sys
import time

from paged import SamplingParams
from paged.help_formatter import ArgumentParser, HelpFormatter
from paged.output_paths import check_output_paths

from .engine import LLMEngine
from .engine_args import add_engine_args, engine_kwargs
from .engine_config import DEFAULT_CPU_KV_CACHE_BYTES, EngineConfig
from .profile import ProfileGrid, profile, write_profile

# ProfileGrid's lists: what each one's values are
GRID = {
    "prefill_chunks": "prompt tokens of each prefill step measured",
    "prefill_contexts": "tokens already cached (a prefix hit) before each prefill chunk",
    "decode_batches": "requests per decode step measured",
    "decode_contexts": "a decode batch's longest context, in tokens",
    "mixed_batches": "decode requests beside one prefill chunk",
    "mixed_chunks": "prompt tokens of the prefill chunk beside those decodes",
}
# Why profile's KV cache is 4x paged serve's: the default grid's decode batches of 64 x 256 and
# 16 x 1,024 tokens need ~1,100 blocks of SmolLM2-135M; 256 MiB holds 364, and they were skipped.
PROFILE_KV_WHY = (f"paged serve's is {DEFAULT_CPU_KV_CACHE_BYTES >> 20} MiB: this leaves room for the default grid's "
                  "larger decode batches (64 x 256, 16 x 1024 tokens), which a smaller cache skips")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m paged.engine")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("bench", add_help=False, help="output tokens/s against transformers' generate() "
                                                      "(python -m paged.engine bench --help)")
    prof = commands.add_parser("profile", help="measure step times for the simulator's profiled cost model",
                               formatter_class=HelpFormatter)
    add_engine_args(prof, kv_cache_memory_bytes=1 << 30, why={"kv_cache_memory_bytes": PROFILE_KV_WHY})
    prof.add_argument("--out", required=True, help="the profile (JSON) to write: python -m sim run --cost-model "
                                                   "reads it, python -m sim fit reports its fit")
    d = ProfileGrid()
    for name, what in GRID.items():
        prof.add_argument(f"--{name.replace('_', '-')}", type=_ints, default=getattr(d, name),
                          help=f"{what}, comma-separated (default: {','.join(map(str, getattr(d, name)))})")
    prof.add_argument("--mixed-context", type=int, default=d.mixed_context,
                      help="the longest context of the decodes beside a prefill chunk, in tokens")
    prof.add_argument("--repeats", type=int, default=d.repeats, help="timed runs of each step, after one warm-up run")
    gen = commands.add_parser("generate", help="generate from one prompt", formatter_class=HelpFormatter)
    add_engine_args(gen)
    gen.add_argument("--prompt", required=True, help="the prompt, as text (no chat template)")
    gen.add_argument("--max-tokens", type=int, default=32, help="maximum number of tokens to generate")
    gen.add_argument("--temperature", type=float, default=0.0,
                     help="randomness of the sampling: 0 is greedy, higher is more random")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from .bench import main as bench_main

        return int(bench_main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)

    grid = None
    if args.command == "profile":
        grid = ProfileGrid(args.prefill_chunks, args.prefill_contexts, args.decode_batches, args.decode_contexts,
                           args.mixed_batches, args.mixed_chunks, args.mixed_context, args.repeats)
    start = time.perf_counter()
    kwargs = engine_kwargs(args)
    if grid:
        kwargs["max_num_batched_tokens"] = grid.max_num_batched_tokens
    try:  # a bad model or option: one line naming it, exit 2, as argparse's own errors
        if grid is None:
            params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
        else:
            check_output_paths([("--out", args.out, ".json")])  # before minutes of profiling
        engine = LLMEngine(EngineConfig(model=args.model, **kwargs))
    except (ValueError, OSError) as e:
        print(f"python -m paged.engine {args.command}: error: {e}", file=sys.stderr)
        return 2
    if args.command == "generate":
        engine.add_request(args.prompt, params)
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    print(out.text)
        return 0
    result = profile(engine, grid)
    write_profile(result, args.out)
    print(f"profile: {len(result['samples'])} steps of {args.model} on {result['device']} "
          f"({result['num_threads']} threads) in {time.perf_counter() - start:.0f} s -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
