"""The quantized KV-cache formats: int8, fp8 (e4m3) and int4, each told apart by the cache's dtype.

**int8** (cache ``torch.int8``): one float32 scale per token and KV head, symmetric, round half
away from zero. Why per token and head: the write path (``reshape_and_cache``) sees one token at a
time, so a token's scale can be fixed when it is written and never revisited. A per-block scale
would have to be re-derived, and every earlier token re-quantized, whenever a new token raised
the block's maximum. The scale is ``max(|x|) / 127`` over the head's ``head_dim`` values, so each
head's largest value is stored exactly and the others to within half a step.

**fp8** (cache ``torch.float8_e4m3fn``, vLLM's ``fp8`` KV): ``x / scale`` rounded to the nearest
e4m3 value (ties to even), saturated at +-448. The scale is static, float32, either per tensor
(shape ``[1]``) or per KV head (``[num_kv_heads]``); nothing is stored per token, so a token costs
``head_dim`` bytes a head. e4m3 keeps 3 mantissa bits: a value whose ``|x / scale|`` lies in the
normal range (``>= 2**-6``) is stored to within ``2**-4`` of itself (half a step of ``2**-3``);
below it, to within ``2**-10 * scale`` (half the smallest subnormal, ``2**-9``).

**int4** (cache ``torch.uint8``, last dimension ``head_dim // 2``): symmetric, ``[-7, 7]``, one
float32 scale per token, KV head and group of ``group_size`` consecutive channels (scales
``[..., head_dim // group_size]``), rounded like int8. Two values a byte: channel ``2j`` in the
low nibble, ``2j + 1`` in the high one, each stored as ``q + 8`` (so a byte never needs a sign).
Why groups: one scale for a whole head lets a single outlier channel (keys have them) flatten
every other channel to a few levels; a group confines it. ``group_size`` must be a power of two
(the kernels tile a group) and even (a byte must not straddle two groups); head_dim must be even.

Error bounds (:func:`error_bound`), for ``s`` a value's scale: int8 and int4 store each value
to within half a step, ``s / 2``, with ``s = max|x| / 127`` over the head, or ``max|x| / 7`` over the
group; fp8 to within ``max(2**-4 |x|, 2**-10 s)`` up to ``448 s``, and past it (saturated) to
``|x| - 448 s``. Each is widened by ``2**-12`` of itself for the float32 rounding of ``x / s`` and
``q * s`` (at most a few ``2**-24`` relative).

Bytes per token and head: int8 ``head_dim + 4``, fp8 ``head_dim``, int4 ``head_dim / 2 +
4 * head_dim / group_size``; float16 ``2 * head_dim``.

The Triton write kernel (``kernels.cache_ops``) does the same arithmetic in the same order, so
the two backends store the same bytes; tests hold them to that.
"""

import torch

QUANT_DTYPE = torch.int8
QUANT_MAX = 127.0
# The smallest max(|x|) a scale is derived from: an all-zero head then gets a tiny, finite
# scale (its values quantize to 0), never a division by zero.
MIN_ABS_MAX = 1e-30

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0

INT4_DTYPE = torch.uint8
INT4_MAX = 7.0
INT4_OFFSET = 8
INT4_GROUP_SIZE = 32  # the default: 4.5 + 1 bits a value with float32 scales

# The names a KV cache's format goes by (engine, simulator, reports), and the dtype that stores it.
CACHE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "int8": QUANT_DTYPE, "fp8": FP8_DTYPE, "int4": INT4_DTYPE}
QUANTIZED_DTYPES = (QUANT_DTYPE, FP8_DTYPE, INT4_DTYPE)
QUANTIZED_NAMES = ("int8", "fp8", "int4")


def _round_half_away(scaled: torch.Tensor) -> torch.Tensor:
    """Conversion to an integer truncates toward zero; adding +-0.5 first makes it round half away."""
    return scaled + torch.where(scaled >= 0, 0.5, -0.5)


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8: ``x [..., head_dim]`` -> (int8 values, float32 scales ``[...]``) with ``x ~= values * scale``."""
    x = x.float()
    scale = x.abs().amax(dim=-1).clamp_min(MIN_ABS_MAX) / QUANT_MAX
    rounded = _round_half_away(x / scale[..., None])
    return rounded.clamp(-QUANT_MAX, QUANT_MAX).to(QUANT_DTYPE), scale


def dequantize(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`quantize`, in float32."""
    return values.float() * scale[..., None]


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8: ``x [..., num_kv_heads, head_dim]``, ``scale [1] or [num_kv_heads]`` -> e4m3 ``x / scale``, saturated.

    torch's float32 -> e4m3 conversion rounds to nearest even; the clamp first makes it saturate
    (e4m3fn has no infinity)."""
    scaled = x.float() / scale.float()[:, None]
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize_fp8(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`quantize_fp8`, in float32."""
    return values.float() * scale.float()[:, None]


def check_int4_layout(head_dim: int, group_size: int) -> None:
    """A ``ValueError`` unless int4 can pack ``head_dim`` channels in groups of ``group_size``."""
    if head_dim % 2:
        raise ValueError(f"int4 KV cache: head_dim {head_dim} is odd, but int4 packs two values a byte")
    if group_size < 2 or group_size & (group_size - 1) or head_dim % group_size:
        raise ValueError(f"int4 KV cache: group_size {group_size} must be a power of two >= 2 "
                         f"dividing head_dim {head_dim}")


def int4_group_size(head_dim: int) -> int:
    """The largest power of two up to :data:`INT4_GROUP_SIZE` dividing ``head_dim`` (32 for 64 and 128)."""
    group = INT4_GROUP_SIZE
    while group > 2 and head_dim % group:
        group //= 2
    check_int4_layout(head_dim, group)
    return group


def quantize_int4(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int4: ``x [..., head_dim]`` -> (uint8 ``[..., head_dim // 2]``, float32 ``[..., head_dim // group_size]``)."""
    check_int4_layout(x.shape[-1], group_size)
    groups = x.float().unflatten(-1, (-1, group_size))
    scale = groups.abs().amax(dim=-1).clamp_min(MIN_ABS_MAX) / INT4_MAX
    rounded = _round_half_away(groups / scale[..., None]).clamp(-INT4_MAX, INT4_MAX).to(torch.int32)
    nibbles = (rounded.flatten(-2) + INT4_OFFSET).unflatten(-1, (-1, 2))
    return (nibbles[..., 0] | (nibbles[..., 1] << 4)).to(INT4_DTYPE), scale


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`quantize_int4`, in float32 ``[..., head_dim]``."""
    nibbles = torch.stack([packed & 15, packed >> 4], dim=-1).flatten(-2).float() - INT4_OFFSET
    group_size = nibbles.shape[-1] // scale.shape[-1]
    return (nibbles.unflatten(-1, (-1, group_size)) * scale[..., None]).flatten(-2)


def cache_bytes_per_token(num_kv_heads: int, head_dim: int, dtype: torch.dtype | str,
                          group_size: int | None = None) -> int:
    """Bytes one token occupies in one layer's K and V caches, scales included.

    ``dtype``: a torch dtype, or a name of :data:`CACHE_DTYPES`; int4's ``group_size`` defaults to
    :func:`int4_group_size`. fp8's static scale is per tensor or head, not per token: no bytes."""
    dtype = CACHE_DTYPES[dtype] if isinstance(dtype, str) else dtype
    if dtype == QUANT_DTYPE:
        per_head = head_dim + torch.float32.itemsize
    elif dtype == FP8_DTYPE:
        per_head = head_dim
    elif dtype == INT4_DTYPE:
        group_size = group_size or int4_group_size(head_dim)
        check_int4_layout(head_dim, group_size)
        per_head = head_dim // 2 + torch.float32.itemsize * head_dim // group_size
    else:
        per_head = head_dim * dtype.itemsize
    return 2 * num_kv_heads * per_head


ROUNDING_SLACK = 1 + 2**-12


def error_bound(x: torch.Tensor, kv_format: str, *, fp8_scale: torch.Tensor | None = None,
                group_size: int | None = None) -> torch.Tensor:
    """The largest ``|stored - x|`` each value of ``x [..., num_kv_heads, head_dim]`` can have once written in
    ``kv_format`` (``"int8"``, ``"fp8"`` with its scale, ``"int4"`` with its group size), derived in the
    module docstring; float32, shaped like ``x``."""
    x = x.float()
    if kv_format == "int8":
        bound = (x.abs().amax(-1, keepdim=True).clamp_min(MIN_ABS_MAX) / QUANT_MAX / 2).expand_as(x)
    elif kv_format == "int4":
        groups = x.abs().unflatten(-1, (-1, group_size))
        bound = (groups.amax(-1, keepdim=True).clamp_min(MIN_ABS_MAX) / INT4_MAX / 2).expand_as(groups).flatten(-2)
    elif kv_format == "fp8":
        scale = fp8_scale.float()[:, None]
        scaled = x.abs() / scale
        within = torch.maximum(scaled * 2**-4, torch.full_like(scaled, 2**-10))
        bound = torch.where(scaled > FP8_MAX, scaled - FP8_MAX, within) * scale
    else:
        raise ValueError(f"kv_format: expected 'int8', 'fp8' or 'int4', got {kv_format!r}")
    return bound * ROUNDING_SLACK
