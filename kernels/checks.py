"""Argument checks shared by every backend: a bad call is a ``ValueError`` naming the argument.

Why here and not in the kernels: a Triton kernel handed a wrong shape or an out-of-range block id
reads or writes someone else's memory and returns garbage, or crashes the process long after
the call. So the public entry points (``kernels.dispatch``) run these checks before any launch,
and both backends may then assume well-formed input. The value checks (lengths, block ids,
slots) read small metadata tensors back to the host, a few synchronisations per call on a GPU:
the price of never having to debug silent garbage. (Benchmarks time the kernels behind them.)
"""

import math

import torch

from kernels import quant

ATTENTION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def _fail(name: str, problem: str) -> None:
    raise ValueError(f"{name}: {problem}")


def _check_tensor(name: str, x, *, ndim: int, dtypes: tuple, like: tuple | None = None) -> None:
    """``like=(other_name, other_tensor)``: ``x`` must be on the same device as that tensor."""
    if not isinstance(x, torch.Tensor):
        _fail(name, f"expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        _fail(name, f"expected {ndim} dimensions, got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        _fail(name, f"dtype {x.dtype} not supported, expected one of {[str(d) for d in dtypes]}")
    if like is not None and x.device != like[1].device:
        _fail(name, f"on {x.device}, but {like[0]} is on {like[1].device}")


def _check_shape(name: str, x: torch.Tensor, shape: tuple) -> None:
    if tuple(x.shape) != tuple(shape):
        _fail(name, f"expected shape {tuple(shape)}, got {tuple(x.shape)}")


def _check_contiguous(name: str, x: torch.Tensor) -> None:
    if not x.is_contiguous():
        _fail(name, "must be contiguous (the kernels address it by its shape)")


def check_kv_cache(key_cache, value_cache, k_scale, v_scale, like: tuple | None = None) -> None:
    """Both caches ``[num_blocks, block_size, num_kv_heads, last_dim]``, alike, contiguous, with their scales.

    ``like=(name, tensor)``: the caches must be on that tensor's device and hold its last
    dimension (``head_dim``; half of it, packed, for int4). A float cache is of ``tensor``'s dtype,
    or float16 under float32 (the engine's "fp16" cache under a float32 model, as on CPUs): writes
    round to nearest, reads convert exactly. (Not bfloat16: Triton 3.8's interpreter rounds float32
    to bfloat16 differently from torch, which the write test caught.)

    The cache's dtype says its format (``kernels.quant``): a float cache has no scales; the others
    need float32 ``k_scale`` and ``v_scale`` shaped ``[num_blocks, block_size, num_kv_heads]`` (int8),
    ``[1]`` or ``[num_kv_heads]`` (fp8, positive and finite), ``[num_blocks, block_size,
    num_kv_heads, head_dim // group_size]`` (int4, ``group_size`` an even power of two).
    """
    _check_tensor("key_cache", key_cache, ndim=4, dtypes=(*ATTENTION_DTYPES, *quant.QUANTIZED_DTYPES), like=like)
    packed = key_cache.dtype == quant.INT4_DTYPE
    if like is not None:
        name, tensor = like
        readable = (tensor.dtype, *((torch.float16,) if tensor.dtype == torch.float32 else ()))
        if key_cache.dtype in ATTENTION_DTYPES and key_cache.dtype not in readable:
            _fail("key_cache", f"a {key_cache.dtype} cache cannot be read exactly as {name}'s {tensor.dtype}: "
                  f"expected one of {[str(d) for d in readable]} or a quantized format")
        head_dim = tensor.shape[-1]
        if packed and head_dim % 2:
            _fail(name, f"head_dim {head_dim} is odd, but an int4 cache packs two values a byte")
        if key_cache.shape[-1] != (head_dim // 2 if packed else head_dim):
            what = f"holds head_dim {2 * key_cache.shape[-1]} packed" if packed else f"head_dim {key_cache.shape[-1]}"
            _fail("key_cache", f"{what}, which does not match {name}'s {head_dim}")
    like = ("key_cache", key_cache)
    _check_tensor("value_cache", value_cache, ndim=4, dtypes=(key_cache.dtype,), like=like)
    _check_shape("value_cache", value_cache, key_cache.shape)
    _check_contiguous("key_cache", key_cache)
    _check_contiguous("value_cache", value_cache)
    if 0 in key_cache.shape[1:]:
        _fail("key_cache", f"block_size, num_kv_heads and head_dim must be >= 1, got shape {tuple(key_cache.shape)}")
    quantized = key_cache.dtype in quant.QUANTIZED_DTYPES
    for scale_name, cache_scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not quantized:
            if cache_scale is not None:
                _fail(scale_name, f"given, but the cache is {key_cache.dtype}, not a quantized format")
            continue
        if cache_scale is None:
            _fail(scale_name, f"required: the cache is {key_cache.dtype}, and its scales are needed to read it")
        if key_cache.dtype == quant.FP8_DTYPE:
            _check_tensor(scale_name, cache_scale, ndim=1, dtypes=(torch.float32,), like=like)
            if cache_scale.shape[0] not in (1, key_cache.shape[2]):
                _fail(scale_name, f"an fp8 scale is per tensor [1] or per KV head [{key_cache.shape[2]}], "
                      f"got shape {tuple(cache_scale.shape)}")
            if not ((cache_scale > 0) & cache_scale.isfinite()).all():
                _fail(scale_name, f"fp8 scales must be positive and finite, got {cache_scale.tolist()}")
        elif packed:
            _check_tensor(scale_name, cache_scale, ndim=4, dtypes=(torch.float32,), like=like)
            _check_shape(scale_name, cache_scale[..., 0], key_cache.shape[:3])
            head_dim, num_groups = 2 * key_cache.shape[3], cache_scale.shape[3]
            group_size = head_dim // max(num_groups, 1)
            if num_groups == 0 or group_size * num_groups != head_dim or group_size < 2 \
                    or group_size & (group_size - 1):
                _fail(scale_name, f"{num_groups} int4 groups do not cut head_dim {head_dim} into groups of a "
                      "power-of-two size >= 2")
        else:
            _check_tensor(scale_name, cache_scale, ndim=3, dtypes=(torch.float32,), like=like)
            _check_shape(scale_name, cache_scale, key_cache.shape[:3])
        _check_contiguous(scale_name, cache_scale)
    if quantized and k_scale.shape != v_scale.shape:
        _fail("v_scale", f"shape {tuple(v_scale.shape)} differs from k_scale's {tuple(k_scale.shape)}")


def check_paged_attention(
    query, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale, out, k_scale, v_scale
) -> None:
    """Every argument of ``paged_attention``, values included."""
    _check_tensor("query", query, ndim=3, dtypes=ATTENTION_DTYPES)
    like = ("query", query)
    check_kv_cache(key_cache, value_cache, k_scale, v_scale, like)
    num_tokens, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    if num_heads % num_kv_heads != 0:  # (check_kv_cache refused num_kv_heads == 0)
        _fail("query", f"num_heads {num_heads} is not a multiple of the cache's num_kv_heads {num_kv_heads}")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale):
        _fail("scale", f"expected a finite real number, got {scale!r}")
    if out is not None:
        _check_tensor("out", out, ndim=3, dtypes=(query.dtype,), like=like)
        _check_shape("out", out, query.shape)
        _check_contiguous("out", out)

    _check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,), like=like)
    num_seqs = block_table.shape[0]
    _check_tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,), like=like)
    _check_shape("seq_lens", seq_lens, (num_seqs,))
    _check_tensor("query_start_loc", query_start_loc, ndim=1, dtypes=(torch.int32,), like=like)
    _check_shape("query_start_loc", query_start_loc, (num_seqs + 1,))

    starts = query_start_loc.tolist()
    if starts[0] != 0 or starts[-1] != num_tokens:
        _fail("query_start_loc", f"must run from 0 to num_tokens={num_tokens}, got {starts[0]}..{starts[-1]}")
    q_lens = query_start_loc.diff()
    if (q_lens < 0).any():
        _fail("query_start_loc", f"must be non-decreasing, got {starts}")
    short = (seq_lens < q_lens).nonzero()
    if len(short):
        seq = int(short[0])
        _fail("seq_lens", f"seq_lens[{seq}]={int(seq_lens[seq])} is shorter than its {int(q_lens[seq])} query tokens")
    capacity = block_table.shape[1] * block_size
    if (seq_lens > capacity).any():
        _fail("seq_lens", f"max {int(seq_lens.max())} exceeds the block table's capacity {capacity}")
    used = torch.arange(block_table.shape[1], device=query.device) < (seq_lens[:, None] + block_size - 1) // block_size
    bad = used & ((block_table < 0) | (block_table >= num_blocks))
    if bad.any():
        seq, col = (int(i) for i in bad.nonzero()[0])
        _fail("block_table", f"block_table[{seq}, {col}]={int(block_table[seq, col])} is outside 0..{num_blocks - 1}")


def check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale) -> None:
    """Every argument of ``reshape_and_cache``, values included."""
    _check_tensor("key", key, ndim=3, dtypes=ATTENTION_DTYPES)
    like = ("key", key)
    check_kv_cache(key_cache, value_cache, k_scale, v_scale, like)
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    if key.shape[1] != num_kv_heads:  # (check_kv_cache matched head_dim)
        _fail("key", f"expected [num_tokens, {num_kv_heads}, head_dim] to match the cache, got {tuple(key.shape)}")
    _check_tensor("value", value, ndim=3, dtypes=(key.dtype,), like=like)
    _check_shape("value", value, key.shape)
    _check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=INDEX_DTYPES, like=like)
    _check_shape("slot_mapping", slot_mapping, key.shape[:1])
    num_slots = num_blocks * block_size
    if ((slot_mapping < -1) | (slot_mapping >= num_slots)).any():
        _fail("slot_mapping", f"slots must lie in -1..{num_slots - 1}, got {slot_mapping.tolist()}")
    stored = slot_mapping[slot_mapping >= 0]
    if stored.unique().numel() != stored.numel():
        _fail("slot_mapping", "two tokens write the same slot, so which one lands is undefined")


def check_copy_blocks(key_cache, value_cache, block_mapping, k_scale, v_scale) -> None:
    """Every argument of ``copy_blocks``, values included."""
    check_kv_cache(key_cache, value_cache, k_scale, v_scale)
    _check_tensor("block_mapping", block_mapping, ndim=2, dtypes=INDEX_DTYPES, like=("key_cache", key_cache))
    if block_mapping.shape[1] != 2:
        _fail("block_mapping", f"expected [num_pairs, 2] rows of (src, dst), got {tuple(block_mapping.shape)}")
    num_blocks = key_cache.shape[0]
    if ((block_mapping < 0) | (block_mapping >= num_blocks)).any():
        _fail("block_mapping", f"block ids must lie in 0..{num_blocks - 1}, got {block_mapping.tolist()}")
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    if dst.unique().numel() != dst.numel() or torch.isin(dst, src).any():
        _fail("block_mapping", "a destination block appears twice or is also a source, so the copy order matters")
