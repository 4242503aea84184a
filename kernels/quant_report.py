"""What the int8 KV cache saves and what it costs: bytes per token, and attention error against the oracle.

    python -m kernels.quant_report [--head-dim 128] [--num-kv-heads 8] [--seq-len 512]

Memory is counted from the formats (``kernels.quant.cache_bytes_per_token``). Accuracy: K/V are
written through ``reshape_and_cache`` into a float cache and into an int8 one; a chunked-prefill
batch then attends over each (``paged_attention``, the default backend for the device), and both
outputs are compared with the float32 oracle run on the float cache. The float cache's own error
is printed beside the int8 one, so the cost of quantization is the difference between them.

Two K/V distributions: Gaussian, and Gaussian with a few outlier channels 10x larger (real keys
have such channels, and they are what stretches a per-head scale).
"""

import argparse

import torch

import kernels
from kernels import quant, reference


def attention_errors(
    *,
    num_seqs: int = 4,
    seq_len: int = 512,
    query_len: int = 16,
    num_heads: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    block_size: int = 16,
    dtype: torch.dtype = torch.float16,
    outlier_channels: int = 0,
    seed: int = 0,
) -> dict:
    """Errors of attention over a ``dtype`` cache and an int8 cache, both against the float32 oracle."""
    generator = torch.Generator().manual_seed(seed)
    num_tokens = num_seqs * seq_len
    key, value = (torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator) for _ in range(2))
    key[..., :outlier_channels] *= 10.0
    key, value = key.to(dtype), value.to(dtype)
    blocks_per_seq = -(-seq_len // block_size)
    num_blocks = num_seqs * blocks_per_seq
    block_table = torch.randperm(num_blocks, generator=generator).view(num_seqs, blocks_per_seq).int()
    positions = torch.arange(seq_len)
    slot_mapping = (block_table[:, positions // block_size] * block_size + positions % block_size).flatten()

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    float_cache = [torch.zeros(shape, dtype=dtype) for _ in range(2)]
    int8_cache = [torch.zeros(shape, dtype=quant.QUANT_DTYPE) for _ in range(2)]
    scales = {"k_scale": torch.zeros(shape[:3]), "v_scale": torch.zeros(shape[:3])}
    kernels.reshape_and_cache(key, value, *float_cache, slot_mapping)
    kernels.reshape_and_cache(key, value, *int8_cache, slot_mapping, **scales)

    query = torch.randn(num_seqs * query_len, num_heads, head_dim, generator=generator).to(dtype)
    metadata = (
        block_table,
        torch.full((num_seqs,), seq_len, dtype=torch.int32),
        torch.arange(num_seqs + 1, dtype=torch.int32) * query_len,
        head_dim**-0.5,
    )
    oracle = reference.paged_attention(query, *float_cache, *metadata)
    outputs = {
        str(dtype).removeprefix("torch."): kernels.paged_attention(query, *float_cache, *metadata),
        "int8": kernels.paged_attention(query, *int8_cache, *metadata, **scales),
    }
    errors = {}
    for name, out in outputs.items():
        diff = out.float() - oracle
        errors[name] = {
            "max_abs": diff.abs().max().item(),
            "mean_abs": diff.abs().mean().item(),
            "relative": (diff.norm() / oracle.norm()).item(),
        }
    return errors


def memory_saving(num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> tuple[int, int, float]:
    """(bytes per token per layer in ``dtype``, in int8 with scales, fraction saved)."""
    plain = quant.cache_bytes_per_token(num_kv_heads, head_dim, dtype)
    compressed = quant.cache_bytes_per_token(num_kv_heads, head_dim, quant.QUANT_DTYPE)
    return plain, compressed, 1 - compressed / plain


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kernels.quant_report", description=__doc__.split("\n")[0])
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=512)
    args = parser.parse_args(argv)

    for dtype in (torch.float16, torch.float32):
        plain, compressed, saved = memory_saving(args.num_kv_heads, args.head_dim, dtype)
        print(
            f"KV bytes per token per layer ({args.num_kv_heads} KV heads x {args.head_dim}): "
            f"{str(dtype).removeprefix('torch.')} {plain}, int8+scales {compressed}: {saved:.1%} saved"
        )
    for outliers in (0, 4):
        errors = attention_errors(
            seq_len=args.seq_len,
            num_heads=args.num_heads,
            num_kv_heads=args.num_kv_heads,
            head_dim=args.head_dim,
            outlier_channels=outliers,
        )
        label = f"{outliers} outlier key channels" if outliers else "gaussian K/V"
        for name, e in errors.items():
            print(
                f"{label:>24}, {name:>8} cache vs oracle: max abs {e['max_abs']:.2e}, "
                f"mean abs {e['mean_abs']:.2e}, relative {e['relative']:.2e}"
            )


if __name__ == "__main__":
    main()
