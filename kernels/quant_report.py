"""What each KV-cache format saves and what it costs: bytes per token, and attention error against its bound.

    python -m kernels.quant_report [--head-dim 128] [--num-kv-heads 8] [--seq-len 512] [--device cuda]

Memory is counted from the formats (``kernels.quant.cache_bytes_per_token``). Accuracy: float32
K/V are written through ``reshape_and_cache`` into a float32 cache and into an int8, an fp8 (one
scale per tensor, 1.0: vLLM's default when a checkpoint carries none) and an int4 cache (groups
of ``quant.int4_group_size``); a chunked-prefill batch of float32 queries then attends over each
(``paged_attention``), and every output is compared with the float32 oracle run on the float32
cache. The float32 cache's own error is printed too: the kernels' arithmetic, next to which the
rest is the format's.

Each quantized error is printed beside its bound, derived here. Let every stored value be within
``e`` of the exact one (``quant.error_bound``: ``e_k[n, d]`` for key ``n``, ``e_v[n, d]``). A score
then moves by at most ``delta = scale * sum_d |q_d| * e_k[n, d]`` (maximised over ``n``), so each
softmax weight by a factor within ``exp(+-2 delta)`` (numerator and normaliser each by
``exp(+-delta)``), and ``sum_n |p'_n - p_n| <= exp(2 delta) - 1``. With ``o = sum_n p_n v_n``:
``|o' - o| <= |sum_n p'_n (v'_n - v_n)| + |sum_n (p'_n - p_n) v_n|
<= max_n e_v[n, d] + (exp(2 delta) - 1) * max_n |v_n[d]|``, for every output channel ``d``.
Nothing in it is fitted: it holds for any K/V, and a kernel that breaks it has a bug.

Two K/V distributions: Gaussian, and Gaussian with a few outlier key channels 10x larger (real
keys have such channels, and they are what stretches a per-head scale; int4's groups confine them).
"""

import argparse

import torch

import kernels
from kernels import quant, reference

FORMATS = quant.QUANTIZED_NAMES
# The kernels' own float32 arithmetic against the oracle's (tests/kernels/layouts.py: TOLERANCES).
FLOAT32_ATOL, FLOAT32_RTOL = 1e-4, 1e-4


def attention_error_bound(query, key, value, key_bound, value_bound, scale: float) -> torch.Tensor:
    """Bound on ``|attention over stored K/V - attention over exact K/V|`` (module docstring), float32 like ``query``.

    ``query [q, heads, d]``: one sequence's new tokens; ``key``, ``value`` ``[n, kv_heads, d]``: its
    whole context, exact; ``*_bound``: the per-value error bounds of their stored forms. Maximising
    over the whole context (not just the keys each query sees) only loosens the bound."""
    group = query.shape[1] // key.shape[1]
    key_bound = key_bound.float().repeat_interleave(group, dim=1)  # [n, heads, d]
    delta = scale * torch.einsum("qhd,nhd->qhn", query.float().abs(), key_bound).amax(-1)  # [q, heads]
    value_max = value.float().abs().amax(0).repeat_interleave(group, dim=0)  # [heads, d]
    value_error = value_bound.float().amax(0).repeat_interleave(group, dim=0)
    return torch.expm1(2 * delta)[..., None] * value_max + value_error


def _quantized_cache(kv_format: str, shape: tuple, group_size: int) -> tuple[list, dict, dict]:
    """Empty K and V caches of ``kv_format``, their scale arguments, and what ``quant.error_bound`` needs."""
    head_dim = shape[3]
    if kv_format == "int8":
        caches = [torch.zeros(shape, dtype=quant.QUANT_DTYPE) for _ in range(2)]
        scales = [torch.zeros(shape[:3]) for _ in range(2)]
        layout = {}
    elif kv_format == "fp8":
        caches = [torch.zeros(shape, dtype=quant.FP8_DTYPE) for _ in range(2)]
        scales = [torch.ones(1) for _ in range(2)]
        layout = {"fp8_scale": scales[0]}
    else:
        caches = [torch.zeros(*shape[:3], head_dim // 2, dtype=quant.INT4_DTYPE) for _ in range(2)]
        scales = [torch.zeros(*shape[:3], head_dim // group_size) for _ in range(2)]
        layout = {"group_size": group_size}
    return caches, {"k_scale": scales[0], "v_scale": scales[1]}, layout


def attention_errors(
    *,
    num_seqs: int = 4,
    seq_len: int = 512,
    query_len: int = 16,
    num_heads: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    block_size: int = 16,
    outlier_channels: int = 0,
    formats: tuple = FORMATS,
    group_size: int | None = None,
    backend: str = "auto",
    device: str = "cpu",
    seed: int = 0,
) -> dict:
    """Errors of attention over a float32 cache and each of ``formats``, against the float32 oracle.

    Per format: ``max_abs``, ``mean_abs``, ``relative`` (Frobenius), and for the quantized ones
    ``bound_max`` (the largest bound) and ``within_bound`` (every output within its own bound, plus
    the float32 arithmetic's tolerance). ``device``: where the caches live and the kernels run (the
    oracle and the bound are computed on the CPU)."""
    generator = torch.Generator().manual_seed(seed)
    group_size = group_size or quant.int4_group_size(head_dim)
    num_tokens = num_seqs * seq_len
    key, value = (torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator) for _ in range(2))
    key[..., :outlier_channels] *= 10.0
    blocks_per_seq = -(-seq_len // block_size)
    num_blocks = num_seqs * blocks_per_seq
    block_table = torch.randperm(num_blocks, generator=generator).view(num_seqs, blocks_per_seq).int()
    positions = torch.arange(seq_len)
    slot_mapping = (block_table[:, positions // block_size] * block_size + positions % block_size).flatten()
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    query = torch.randn(num_seqs * query_len, num_heads, head_dim, generator=generator)
    metadata = (
        block_table,
        torch.full((num_seqs,), seq_len, dtype=torch.int32),
        torch.arange(num_seqs + 1, dtype=torch.int32) * query_len,
        head_dim**-0.5,
    )

    def on(*tensors):
        return [t.to(device) for t in tensors]

    def attend(caches, scales):
        caches, scales = on(*caches), dict(zip(scales, on(*scales.values()), strict=True))
        kernels.reshape_and_cache(*on(key, value), *caches, on(slot_mapping)[0], **scales, backend=backend)
        return kernels.paged_attention(*on(query), *caches, *on(*metadata[:3]), metadata[3], **scales,
                                       backend=backend).cpu()

    float_cache = [torch.zeros(shape) for _ in range(2)]
    kernels.reshape_and_cache(key, value, *float_cache, slot_mapping, backend="torch")
    oracle = reference.paged_attention(query, *float_cache, *metadata)
    errors = {"float32": _errors(attend([torch.zeros(shape) for _ in range(2)], {}), oracle)}
    for kv_format in formats:
        caches, scales, layout = _quantized_cache(kv_format, shape, group_size)
        out = attend(caches, scales)
        bound = torch.cat([
            attention_error_bound(query[seq * query_len:(seq + 1) * query_len], k, v,
                                  quant.error_bound(k, kv_format, **layout), quant.error_bound(v, kv_format, **layout),
                                  metadata[-1])
            for seq, (k, v) in enumerate(zip(key.split(seq_len), value.split(seq_len), strict=True))
        ])
        errors[kv_format] = _errors(out, oracle)
        slack = FLOAT32_ATOL + FLOAT32_RTOL * oracle.abs()
        errors[kv_format]["bound_max"] = bound.max().item()
        errors[kv_format]["within_bound"] = bool(((out - oracle).abs() <= bound + slack).all())
    return errors


def _errors(out: torch.Tensor, oracle: torch.Tensor) -> dict:
    diff = out.float() - oracle
    return {"max_abs": diff.abs().max().item(), "mean_abs": diff.abs().mean().item(),
            "relative": (diff.norm() / oracle.norm()).item()}


def memory_per_format(num_kv_heads: int, head_dim: int) -> dict[str, int]:
    """Bytes per token per layer (K and V, scales included) of float16 and each quantized format."""
    return {name: quant.cache_bytes_per_token(num_kv_heads, head_dim, name) for name in ("float16", *FORMATS)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kernels.quant_report", description=__doc__.split("\n")[0])
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--num-heads", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--device", default="cpu", help="where the kernels run (cuda: the Triton kernels)")
    args = parser.parse_args(argv)

    memory = memory_per_format(args.num_kv_heads, args.head_dim)
    print(f"KV bytes per token per layer ({args.num_kv_heads} KV heads x {args.head_dim}, scales included):")
    for name, size in memory.items():
        print(f"  {name:>8}: {size:6d} B, {memory['float16'] / size:.2f}x the tokens of float16")
    for outliers in (0, 4):
        errors = attention_errors(seq_len=args.seq_len, num_heads=args.num_heads, num_kv_heads=args.num_kv_heads,
                                  head_dim=args.head_dim, outlier_channels=outliers, device=args.device)
        label = f"{outliers} outlier key channels" if outliers else "gaussian K/V"
        broken = [name for name, e in errors.items() if e.get("within_bound") is False]
        for name, e in errors.items():
            bound = (f", bound {e['bound_max']:.2e} ({'held' if e['within_bound'] else 'BROKEN'})"
                     if "bound_max" in e else "")
            print(f"{label:>24}, {name:>8} cache vs oracle: max abs {e['max_abs']:.2e}, "
                  f"mean abs {e['mean_abs']:.2e}, relative {e['relative']:.2e}{bound}")
        if broken:
            raise SystemExit(f"the derived error bound was broken by {broken}: a kernel bug")


if __name__ == "__main__":
    main()
