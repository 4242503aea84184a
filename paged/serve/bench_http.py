"""What HTTP costs: the same requests streamed through `paged serve` and run on `AsyncLLM` in-process.

    python -m paged.serve.bench_http [--model smollm2-135m] [--num-requests 64] [--rounds 2]

The requests are the engine benchmark's (the first rows of the Azure conversation trace, lengths
scaled; random prompt token ids; greedy; EOS ignored, so both sides generate exactly the same
tokens). In-process, all are submitted to one AsyncLLM at once and consumed as streams. Over
HTTP, a server with the same engine settings runs in its own process, and the same number of
concurrent clients stream `/v1/completions` with the official `openai` client (SSE parsed by
it). Output tokens/s is wall-clock from the first submission to the last token. The two run in
alternation `--rounds` times and each one's best counts, as the machine's background load drifts.
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from paged import SamplingParams
from paged.engine import AsyncLLM
from paged.engine.bench import load_requests
from paged.engine.engine_args import add_engine_args, engine_kwargs
from paged.help_formatter import ArgumentParser, RawDescriptionHelpFormatter
from paged.workloads.traces import AZURE_CONV

from .server_process import launched_server


async def run_in_process(engine: AsyncLLM, requests: list[tuple[list[int], int]]) -> tuple[float, int]:
    """(seconds, output tokens) for all requests at once."""
    async def one(prompt, n):
        last = None
        async for out in engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)):
            last = out
        return len(last.token_ids)

    start = time.perf_counter()
    tokens = await asyncio.gather(*(one(p, n) for p, n in requests))
    return time.perf_counter() - start, sum(tokens)


async def run_http(url: str, model: str, requests: list[tuple[list[int], int]]) -> tuple[float, int]:
    import openai

    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=3600) as client:
        async def one(prompt, n):
            stream = await client.completions.create(model=model, prompt=prompt, max_tokens=n, temperature=0,
                                                     stream=True, stream_options={"include_usage": True},
                                                     extra_body={"ignore_eos": True})
            usage = None
            async for chunk in stream:
                usage = chunk.usage or usage
            return usage.completion_tokens

        start = time.perf_counter()
        tokens = await asyncio.gather(*(one(p, n) for p, n in requests))
        return time.perf_counter() - start, sum(tokens)


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m paged.serve.bench_http", description=__doc__,
                                 formatter_class=RawDescriptionHelpFormatter)
    # The engine benchmark's settings: prefix caching off (every round repeats the prompts), one thread.
    add_engine_args(ap, model="smollm2-135m", max_num_seqs=64, max_num_batched_tokens=512,
                    kv_cache_memory_bytes=1 << 30, enable_prefix_caching=False, threads=1)
    ap.add_argument("--num-requests", type=int, default=64, help="requests: the Azure conversation trace's first rows")
    ap.add_argument("--input-scale", type=float, default=1 / 16, help="factor on each prompt's length from the trace")
    ap.add_argument("--output-scale", type=float, default=1 / 4, help="factor on each output's length from the trace")
    ap.add_argument("--rounds", type=int, default=2, help="alternating runs of each side; the best counts")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    kwargs = engine_kwargs(args)
    flags = [f"--{k.replace('_', '-')}" if v is True else f"--no-{k.replace('_', '-')}" if v is False
             else f"--{k.replace('_', '-')}={v}" for k, v in kwargs.items()]

    engine = AsyncLLM(args.model, **kwargs)
    requests = load_requests(AZURE_CONV, args.num_requests, args.input_scale, args.output_scale,
                             engine.engine.model_config.vocab_size)
    print(f"{len(requests)} requests: {sum(len(p) for p, _ in requests)} prompt tokens, "
          f"{sum(n for _, n in requests)} output tokens; engine {kwargs}", flush=True)
    best = {"in-process": 0.0, "http": 0.0}
    with tempfile.TemporaryDirectory() as tmp, \
            launched_server(args.model, [*flags, "--log-level", "warning"], Path(tmp) / "server.log") as server:
        asyncio.run(run_http(server.url, args.model, requests[:2]))  # warm-up
        asyncio.run(run_in_process(engine, requests[:2]))
        for r in range(args.rounds):
            for name, run in (("in-process", lambda: run_in_process(engine, requests)),
                              ("http", lambda: run_http(server.url, args.model, requests))):
                seconds, tokens = asyncio.run(run())
                best[name] = max(best[name], tokens / seconds)
                print(f"round {r + 1}: {name:<10} {seconds:6.1f} s  {tokens / seconds:7.1f} output tokens/s",
                      flush=True)
    ratio = best["http"] / best["in-process"]
    print(f"best: in-process {best['in-process']:.1f} tokens/s, HTTP streaming {best['http']:.1f} tokens/s: "
          f"HTTP keeps {ratio:.1%} (costs {1 - ratio:.1%}; goal: at most 10%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
