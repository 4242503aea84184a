"""The int8 KV-cache format: one float32 scale per token and KV head, symmetric, round half away from zero.

Why per token and head: the write path (``reshape_and_cache``) sees one token at a time, so a
token's scale can be fixed when it is written and never revisited. A per-block scale would have
to be re-derived, and every earlier token re-quantized, whenever a new token raised the block's
maximum. The scale is ``max(|x|) / 127`` over the head's ``head_dim`` values, so each head's
largest value is stored exactly and the others to within half a step.

Cost: ``head_dim`` bytes plus a 4-byte scale per token and head, against ``2 * head_dim`` bytes
for float16/bfloat16 (48% less at head dim 128) and ``4 * head_dim`` for float32.

The Triton write kernel (``kernels.cache_ops``) does the same arithmetic in the same order, so
the two backends store the same bytes; tests hold them to that.
"""

import torch

QUANT_DTYPE = torch.int8
QUANT_MAX = 127.0
# The smallest max(|x|) a scale is derived from: an all-zero head then gets a tiny, finite
# scale (its values quantize to 0), never a division by zero.
MIN_ABS_MAX = 1e-30


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., head_dim]`` -> (int8 values, float32 scales ``[...]``) with ``x ~= values * scale``."""
    x = x.float()
    scale = x.abs().amax(dim=-1).clamp_min(MIN_ABS_MAX) / QUANT_MAX
    scaled = x / scale[..., None]
    # Conversion to int8 truncates toward zero; adding +-0.5 first makes it round half away.
    rounded = scaled + torch.where(scaled >= 0, 0.5, -0.5)
    return rounded.clamp(-QUANT_MAX, QUANT_MAX).to(QUANT_DTYPE), scale


def dequantize(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`quantize`, in float32."""
    return values.float() * scale[..., None]


def cache_bytes_per_token(num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes one token occupies in one layer's K and V caches, scales included for int8."""
    if dtype == QUANT_DTYPE:
        per_head = head_dim * QUANT_DTYPE.itemsize + torch.float32.itemsize
    else:
        per_head = head_dim * dtype.itemsize
    return 2 * num_kv_heads * per_head
