"""How well LZ4 compresses real KV blocks, and how fast: the profile the simulator's compressed swap reads.

    python -m paged.engine.swap_profile --out kv_swap.json [--model smollm2-135m]
    python -m sim run ... --preemption swap --swap-compression lz4 --swap-profile kv_swap.json

`--out` has no default: the simulator's own profile (`sim/profiles/kv_swap_lz4.json`, measured on
SmolLM2-135M) is a tracked file, which a default there let a first try overwrite unasked.

For each kv_cache_dtype, the engine generates ``--max-tokens`` from each of a set of prompts
(``paged.engine.kv_accuracy``'s; EOS ignored, since the instruct model often stops within a few
tokens without its chat template) so its cache fills with real K/V, then every block that holds
any (non-zero bytes) is compressed and decompressed exactly as a compressed swap does
(``paged.engine.swap_compression``: one frame per block, its K/V in every layer and its
per-token scales). Reported per dtype and codec:

- ``ratio``: compressed bytes / raw bytes over all those blocks (1.0: nothing saved);
- ``ratio_full_blocks``: the same over the blocks whose every slot holds a token. A sequence's
  last block is partly unwritten (zeros), and zeros are all LZ4 finds to compress in float KV:
  with short sequences they dominate ``ratio``, while a long context (a thousand tokens, 60-odd
  blocks) has one partial block in sixty. The simulator reads this one;
- ``compress_mb_s``, ``decompress_mb_s``: raw megabytes (1e6 bytes) per second on one thread, the
  best of ``--repeats`` passes over all blocks (the machine is shared: the best pass is the one
  least disturbed by others).

A block's last positions may be unwritten (zeros) if a sequence ended mid-block, as in a real
swap. The ratio depends on the format and the model, not the GPU; the speeds are this CPU's.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import lz4
import torch

from paged import SamplingParams
from paged.help_formatter import ArgumentParser, HelpFormatter
from paged.output_paths import check_output_paths

from .kv_accuracy import prompts
from .llm import LLM
from .swap_compression import CODECS, compress, decompress

DTYPES = ("fp16", "int8", "fp8", "int4")


def filled_blocks(llm: LLM) -> list[list[torch.Tensor]]:
    """Each device block holding any K/V: its tensors as a swap moves them (CPU), in block order."""
    cache = llm.llm_engine.cache
    moved = [t.cpu() for t in cache.swapped_tensors()]
    used = (moved[0].view(torch.uint8) != 0).flatten(3).any(-1).any(1).any(0)  # [num_blocks]
    return [[t[:, :, block] for t in moved] for block in used.nonzero().flatten().tolist()]


def is_full(block: list[torch.Tensor]) -> bool:
    """Whether every slot of the block holds K/V: no token position whose bytes are all zero, in any layer."""
    cache = block[0].view(torch.uint8)  # [layers, 2, block_size, heads, dim]
    return bool(cache.flatten(3).any(-1).all())


def time_codec(blocks: list[list[torch.Tensor]], codec: str, repeats: int) -> dict:
    """Ratio and single-thread speeds of ``codec`` over ``blocks`` (module docstring)."""
    raw = sum(t.numel() * t.element_size() for block in blocks for t in block)
    frames = [compress(block, codec) for block in blocks]
    full = [i for i, block in enumerate(blocks) if is_full(block)]
    raw_full = sum(t.numel() * t.element_size() for i in full for t in blocks[i])
    for block, frame in zip(blocks, frames, strict=True):  # the round trip is exact, or nothing is measured
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                   for a, b in zip(decompress(frame, block, codec), block, strict=True))
    best_out = best_in = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for block in blocks:
            compress(block, codec)
        best_out = min(best_out, time.perf_counter() - start)
        start = time.perf_counter()
        for block, frame in zip(blocks, frames, strict=True):
            decompress(frame, block, codec)
        best_in = min(best_in, time.perf_counter() - start)
    return {"ratio": sum(map(len, frames)) / raw,
            "ratio_full_blocks": sum(len(frames[i]) for i in full) / raw_full if full else None,
            "num_full_blocks": len(full), "compress_mb_s": raw / best_out / 1e6,
            "decompress_mb_s": raw / best_in / 1e6, "raw_bytes": raw, "num_blocks": len(blocks),
            "block_bytes": raw // len(blocks)}


def measure(model: str, dtypes: tuple[str, ...], num_prompts: int, max_tokens: int, repeats: int) -> dict:
    torch.set_num_threads(1)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    results = {}
    for kv_cache_dtype in dtypes:
        llm = LLM(model, kv_cache_dtype=kv_cache_dtype, kv_cache_memory_bytes=64 << 20)
        llm.generate(prompts(num_prompts), params)
        blocks = filled_blocks(llm)
        results[kv_cache_dtype] = {codec: time_codec(blocks, codec, repeats) for codec in CODECS}
    return results


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m paged.engine.swap_profile", description=__doc__.split("\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="name or path of the model to use")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated kv_cache_dtypes")
    parser.add_argument("--num-prompts", type=int, default=24, help="prompts whose KV fills the blocks")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens generated from each prompt (EOS ignored)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes over all blocks; the best counts")
    parser.add_argument("--out", required=True, help="the profile to write (JSON), which python -m sim run "
                                                         "--swap-profile reads")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_output_paths([("--out", args.out, ".json")])  # before the minutes of measuring
    except (ValueError, OSError) as e:
        print(f"python -m paged.engine.swap_profile: error: {e}", file=sys.stderr)
        return 2
    results = measure(args.model, tuple(args.dtypes.split(",")), args.num_prompts, args.max_tokens, args.repeats)
    profile = {"model": args.model, "codec_library": f"lz4 {lz4.version.version} (lz4.frame, default level)",
               "machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "threads": 1,
               "num_prompts": args.num_prompts, "max_tokens": args.max_tokens, "kv_cache_dtypes": results}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(profile, f, indent=2)
        f.write("\n")
    print(f"LZ4 on real KV blocks of {args.model} (one thread, {profile['machine']}) -> {args.out}")
    print(f"{'kv_cache_dtype':>14} {'codec':>12} {'blocks':>7} {'block KB':>9} {'ratio':>6} {'full blocks':>12} "
          f"{'their ratio':>12} {'compress MB/s':>14} {'decompress MB/s':>16}")
    for name, codecs in results.items():
        for codec, r in codecs.items():
            full = "-" if r["ratio_full_blocks"] is None else f"{r['ratio_full_blocks']:.3f}"
            print(f"{name:>14} {codec:>12} {r['num_blocks']:>7} {r['block_bytes'] / 1e3:>9.1f} {r['ratio']:>6.3f} "
                  f"{r['num_full_blocks']:>12} {full:>12} {r['compress_mb_s']:>14.0f} {r['decompress_mb_s']:>16.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
