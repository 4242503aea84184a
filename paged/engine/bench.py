"""Throughput of the engine against transformers' generate() with static padded batches.

    python -m paged.engine.bench [--num-requests 64] [--input-scale 0.0625] [--output-scale 0.25]

The requests are the first `num_requests` rows of the Azure LLM conversation trace (2023),
with prompt and output lengths multiplied by the scales so the run takes minutes on a small
CPU; prompts are random token ids, every request generates exactly its (scaled) output length
(EOS ignored), greedy. Both systems run the same requests with the same weights (the model's
GGUF, read by each side) in the same process, one after the other.

- engine: all requests submitted at once; continuous batching, paged KV cache.
- transformers: batches of `--hf-batch-size` requests in trace order, left-padded to the
  longest prompt, each batch generating until its longest output is done — static batching.
  Only each request's own output tokens count.

Output tokens per second are wall-clock over the whole run, model loading excluded. The two
systems run in alternation `--rounds` times and each one's best run counts, because on a
shared machine the background load drifts during a run. Both run single-threaded by default:
on a small shared machine, OpenMP's second thread stalls at every barrier whenever another
process holds the other core, and run times then swing tenfold; one thread is steady.
"""
from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from paged import SamplingParams
from paged.help_formatter import ArgumentParser, RawDescriptionHelpFormatter
from paged.workloads.traces import AZURE_CONV, read_trace

from .llm import LLM
from .loader import resolve_model_path


def load_requests(trace: Path, num: int, input_scale: float, output_scale: float, vocab: int,
                  seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) for the trace's first `num` rows, lengths scaled."""

    rng = random.Random(seed)
    rows = read_trace(trace)
    requests = []
    for prompt, output in zip(rows.num_prompt_tokens[:num], rows.num_output_tokens[:num]):
        prompt_len = max(1, round(int(prompt) * input_scale))
        output_len = max(1, round(int(output) * output_scale))
        requests.append(([rng.randrange(32, vocab) for _ in range(prompt_len)], output_len))
    return requests


def hf_model_from_gguf(path: Path):
    """transformers' own conversion of a Llama GGUF (its names, q/k order and dequantization path),
    into a plain LlamaForCausalLM: `from_pretrained(gguf_file=...)` would need `accelerate`."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    raw = load_gguf_checkpoint(str(path))["config"]
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in raw.items()
                                            if k not in ("model_type", "_model_name_or_path")}))
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    model.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False)
    model.tie_weights()
    return model.eval()


def run_engine(llm: LLM, requests) -> float:
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in requests]
    start = time.perf_counter()
    outputs = llm.generate([p for p, _ in requests], params)
    elapsed = time.perf_counter() - start
    assert [len(o.token_ids) for o in outputs] == [n for _, n in requests]
    return elapsed


@torch.inference_mode()
def run_hf_static(model, requests, batch_size: int, pad_id: int) -> float:
    from transformers import GenerationConfig

    start = time.perf_counter()
    for i in range(0, len(requests), batch_size):
        batch = requests[i:i + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p, _ in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch])
        longest = max(n for _, n in batch)
        config = GenerationConfig(max_new_tokens=longest, do_sample=False,
                                  pad_token_id=pad_id, eos_token_id=None)
        out = model.generate(ids, attention_mask=mask, generation_config=config)
        assert out.shape[1] == width + longest
    return time.perf_counter() - start


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="paged bench engine", description=__doc__,
                                 formatter_class=RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a Llama-architecture GGUF, or smollm2-135m")
    ap.add_argument("--trace", type=Path, default=AZURE_CONV,
                    help=f"the trace whose first --num-requests rows are the requests (default: traces/"
                         f"{AZURE_CONV.name})")
    ap.add_argument("--num-requests", type=int, default=64, help="requests: the trace's first rows")
    ap.add_argument("--input-scale", type=float, default=1 / 16,
                    help="factor on each prompt's length from the trace, rounded, at least 1 token")
    ap.add_argument("--output-scale", type=float, default=1 / 4,
                    help="factor on each output's length from the trace, rounded, at least 1 token")
    ap.add_argument("--hf-batch-size", type=int, default=8,
                    help="transformers: requests per static batch, in trace order, left-padded")
    ap.add_argument("--max-num-seqs", type=int, default=64,
                    help="engine: maximum number of sequences to be processed in a single iteration")
    ap.add_argument("--max-num-batched-tokens", type=int, default=512,
                    help="engine: maximum number of tokens to be processed in a single iteration")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads for both systems")
    ap.add_argument("--rounds", type=int, default=2, help="alternating runs of each system; the best counts")
    ap.add_argument("--skip-hf", action="store_true", help="measure the engine only")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)

    # Prefix caching off: every round runs the same prompts again, and transformers has no
    # cache to reuse them from, so hits would flatter the engine.
    llm = LLM(args.model, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              kv_cache_memory_bytes=1 << 30, enable_prefix_caching=False, threads=args.threads)
    requests = load_requests(args.trace, args.num_requests, args.input_scale, args.output_scale,
                             llm.llm_engine.model_config.vocab_size)
    num_out = sum(n for _, n in requests)
    print(f"{len(requests)} requests from {args.trace.name}: prompt lengths x{args.input_scale:g} "
          f"({sum(len(p) for p, _ in requests)} tokens, max {max(len(p) for p, _ in requests)}), output lengths "
          f"x{args.output_scale:g} ({num_out} tokens, max {max(n for _, n in requests)}); "
          f"{torch.get_num_threads()} torch threads")
    run_engine(llm, requests[:2])  # warm-up
    model = None if args.skip_hf else hf_model_from_gguf(resolve_model_path(args.model))
    pad_id = llm.llm_engine.model_config.eos_token_ids[0]
    # Alternate the two systems: on a shared machine the load drifts, and the best of each is what it can do.
    best_engine = best_hf = float("inf")
    for r in range(args.rounds):
        engine_s = run_engine(llm, requests)
        best_engine = min(best_engine, engine_s)
        line = f"round {r + 1}: engine {engine_s:.1f} s = {num_out / engine_s:.1f} output tokens/s"
        if model is not None:
            hf_s = run_hf_static(model, requests, args.hf_batch_size, pad_id)
            best_hf = min(best_hf, hf_s)
            line += (f"; transformers static batches of {args.hf_batch_size}: {hf_s:.1f} s = "
                     f"{num_out / hf_s:.1f} output tokens/s; ratio {hf_s / engine_s:.2f}x")
        print(line, flush=True)
    print(f"best: engine {num_out / best_engine:.1f} output tokens/s "
          f"({llm.scheduler.num_preemptions} preemptions, max_num_seqs={args.max_num_seqs})")
    if model is not None:
        print(f"best: transformers {num_out / best_hf:.1f} output tokens/s; speed-up {best_hf / best_engine:.2f}x")

if __name__ == "__main__":
    main()
