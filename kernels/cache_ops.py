"""Cache writes in Triton: ``reshape_and_cache`` (new K/V into their slots) and ``copy_blocks`` (copy-on-write).

``reshape_and_cache`` runs one program per token, all KV heads at once; a slot of -1 (a padding
token, or one whose K/V need not be kept) writes nothing. K and V are two launches of the same
kernel, so the write logic, quantization included, exists once. For a quantized cache
(``kernels.quant``) the kernel does what the torch path does, in the same order of operations, so
the Triton and torch backends store the same bytes:

- int8: each head's scale, then rounding half away from zero.
- fp8: ``x / scale``, saturated at +-448, then rounded to the e4m3 grid *in float32 arithmetic*
  (ties to even: ``(|y| + 1.5 * 2**23) - 1.5 * 2**23`` rounds ``|y| < 2**22`` to an integer, the step
  being ``2**(exponent - 3)``, never finer than the subnormals' ``2**-9``; the sign put back after)
  before the cast, which is then exact. Why not let the cast round: Triton 3.8's interpreter converts float32 to fp8e4nv
  wrongly. Measured on 65,536 values spread over 2**-14..2**9: 11% differ from torch's
  round-to-nearest-even, in two ways, subnormals truncated toward zero (1e-3 stored as 0, not
  2**-9) and a rounding that carries into the next binade landing a binade low (-127.4 stored as
  -64, -7.95 as -4); values past 448 wrap (1000 stored as 256). The cast of a value already on the
  grid is exact there, and on a GPU (sm_89+, where Triton has fp8e4nv) the result is the same.
- int4: the kernel ``_write_slots_int4_kernel`` loads a token as ``[heads, groups, pairs]`` twice,
  even and odd channels, so a group's scale is one reduction and each pair lands in one byte.

``copy_blocks`` copies whole blocks, which are contiguous runs of
``block_size * num_kv_heads * head_dim`` elements in the vLLM layout: one program per (pair,
chunk of a block), the same kernel for K, V and their scales.
"""

import torch
import triton
import triton.language as tl

from kernels import quant
from kernels.jit import Kernel

# KV_FORMAT, shared with kernels.attention; constexpr, so that kernels may read them as globals.
FLOAT, INT8, FP8, INT4 = (tl.constexpr(code) for code in range(4))
# 1.5 * 2**23: adding and subtracting it rounds |y| < 2**22 to an integer, ties to even.
RNE_MAGIC = tl.constexpr(12582912.0)


def kv_format(cache: torch.Tensor) -> int:
    """The KV_FORMAT constant of a cache, from its dtype (see ``kernels.quant``)."""
    return {quant.QUANT_DTYPE: INT8, quant.FP8_DTYPE: FP8, quant.INT4_DTYPE: INT4}.get(cache.dtype, FLOAT)


@Kernel
def _write_slots_kernel(
    new_ptr,  # [num_tokens, num_kv_heads, head_dim]
    cache_ptr,  # [num_blocks * block_size, num_kv_heads, head_dim], contiguous
    cache_scale_ptr,  # int8: [num_blocks * block_size, num_kv_heads]; fp8: [1] or [num_kv_heads]; float32
    slot_mapping_ptr,
    stride_new_token,
    stride_new_head,
    stride_new_dim,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    KV_FORMAT: tl.constexpr,
    FP8_SCALE_STRIDE: tl.constexpr,  # 0 for one scale per tensor, 1 per head
    QUANT_MAX: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MIN_ABS_MAX: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    mask = (heads < NUM_KV_HEADS)[:, None] & (dims < HEAD_DIM)[None, :]
    new = tl.load(
        new_ptr
        + token.to(tl.int64) * stride_new_token
        + heads[:, None] * stride_new_head
        + dims[None, :] * stride_new_dim,
        mask=mask,
        other=0.0,
    )
    cache_offset = (slot * NUM_KV_HEADS + heads[:, None]) * HEAD_DIM + dims[None, :]
    if KV_FORMAT == INT8:
        new = new.to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(new), axis=1), MIN_ABS_MAX) / QUANT_MAX
        scaled = new / scale[:, None]
        rounded = scaled + tl.where(scaled >= 0.0, 0.5, -0.5)
        rounded = tl.minimum(tl.maximum(rounded, -QUANT_MAX), QUANT_MAX)
        tl.store(cache_ptr + cache_offset, rounded.to(tl.int8), mask=mask)
        tl.store(cache_scale_ptr + slot * NUM_KV_HEADS + heads, scale, mask=heads < NUM_KV_HEADS)
    elif KV_FORMAT == FP8:
        head_scale = tl.load(cache_scale_ptr + heads * FP8_SCALE_STRIDE, mask=heads < NUM_KV_HEADS, other=1.0)
        # div_rn: IEEE division, as torch's (a plain "/" compiles to the approximate div.full.f32).
        scaled = tl.div_rn(new.to(tl.float32), head_scale[:, None])
        scaled = tl.minimum(tl.maximum(scaled, -FP8_MAX), FP8_MAX)
        bits = scaled.to(tl.int32, bitcast=True)
        exponent = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
        step = ((exponent + 124) << 23).to(tl.float32, bitcast=True)  # 2 ** (exponent - 3)
        inverse_step = ((130 - exponent) << 23).to(tl.float32, bitcast=True)  # powers of two: both products exact
        magnitude = ((tl.abs(scaled) * inverse_step + RNE_MAGIC) - RNE_MAGIC) * step
        rounded = tl.where(bits < 0, -magnitude, magnitude)  # the sign bit: -1e-4 becomes -0.0, as in torch
        tl.store(cache_ptr + cache_offset, rounded.to(cache_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(cache_ptr + cache_offset, new, mask=mask)


@triton.jit
def _nibble(x, scale, QUANT_MAX: tl.constexpr, OFFSET: tl.constexpr):
    """int4 value of ``x / scale``, rounded half away from zero, plus OFFSET: 0..15 in an int32."""
    scaled = x / scale
    rounded = scaled + tl.where(scaled >= 0.0, 0.5, -0.5)
    return tl.minimum(tl.maximum(rounded, -QUANT_MAX), QUANT_MAX).to(tl.int32) + OFFSET


@Kernel
def _write_slots_int4_kernel(
    new_ptr,  # [num_tokens, num_kv_heads, head_dim]
    cache_ptr,  # [num_blocks * block_size, num_kv_heads, head_dim // 2] uint8, contiguous
    cache_scale_ptr,  # [num_blocks * block_size, num_kv_heads, num_groups] float32
    slot_mapping_ptr,
    stride_new_token,
    stride_new_head,
    stride_new_dim,
    NUM_KV_HEADS: tl.constexpr,
    NUM_GROUPS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    GROUPS_PAD: tl.constexpr,
    HALF_GROUP: tl.constexpr,  # group_size // 2: the bytes of one group
    QUANT_MAX: tl.constexpr,
    OFFSET: tl.constexpr,
    MIN_ABS_MAX: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    heads = tl.arange(0, HEADS_PAD)[:, None, None]
    groups = tl.arange(0, GROUPS_PAD)[None, :, None]
    pairs = tl.arange(0, HALF_GROUP)[None, None, :]
    mask = (heads < NUM_KV_HEADS) & (groups < NUM_GROUPS) & (pairs < HALF_GROUP)
    even = groups * (2 * HALF_GROUP) + 2 * pairs
    row = new_ptr + token.to(tl.int64) * stride_new_token + heads * stride_new_head
    low = tl.load(row + even * stride_new_dim, mask=mask, other=0.0).to(tl.float32)
    high = tl.load(row + (even + 1) * stride_new_dim, mask=mask, other=0.0).to(tl.float32)
    abs_max = tl.maximum(tl.max(tl.abs(low), axis=2), tl.max(tl.abs(high), axis=2))
    scale = tl.maximum(abs_max, MIN_ABS_MAX) / QUANT_MAX  # [heads, groups]
    low_nibble = _nibble(low, scale[:, :, None], QUANT_MAX, OFFSET)
    packed = low_nibble | (_nibble(high, scale[:, :, None], QUANT_MAX, OFFSET) << 4)
    head_row = slot * NUM_KV_HEADS + heads
    tl.store(cache_ptr + head_row * (NUM_GROUPS * HALF_GROUP) + groups * HALF_GROUP + pairs, packed.to(tl.uint8),
             mask=mask)
    scale_mask = (heads < NUM_KV_HEADS) & (groups < NUM_GROUPS)
    tl.store(cache_scale_ptr + head_row * NUM_GROUPS + groups, scale[:, :, None], mask=scale_mask)


@Kernel
def _copy_blocks_kernel(
    cache_ptr,  # [num_blocks, block_numel], contiguous
    block_mapping_ptr,  # [num_pairs, 2] rows of (src, dst), contiguous
    block_numel,
    CHUNK: tl.constexpr,
):
    pair = tl.program_id(0)
    src = tl.load(block_mapping_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(block_mapping_ptr + 2 * pair + 1).to(tl.int64)
    offsets = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    mask = offsets < block_numel
    values = tl.load(cache_ptr + src * block_numel + offsets, mask=mask)
    tl.store(cache_ptr + dst * block_numel + offsets, values, mask=mask)


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    """Same contract as ``kernels.dispatch.reshape_and_cache``; inputs already checked."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    fmt = kv_format(key_cache)
    kernel = _write_slots_int4_kernel if fmt == INT4 else _write_slots_kernel
    launch = kernel.on(key.device)
    slot_mapping = slot_mapping.contiguous()  # read as a packed array
    for new, cache, cache_scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        args = (new, cache, cache if cache_scale is None else cache_scale, slot_mapping, *new.stride())
        if fmt == INT4:
            num_groups = cache_scale.shape[-1]
            launch[(num_tokens,)](
                *args,
                NUM_KV_HEADS=num_kv_heads,
                NUM_GROUPS=num_groups,
                HEADS_PAD=triton.next_power_of_2(num_kv_heads),
                GROUPS_PAD=triton.next_power_of_2(num_groups),
                HALF_GROUP=head_dim // num_groups // 2,
                QUANT_MAX=quant.INT4_MAX,
                OFFSET=quant.INT4_OFFSET,
                MIN_ABS_MAX=quant.MIN_ABS_MAX,
            )
            continue
        launch[(num_tokens,)](
            *args,
            NUM_KV_HEADS=num_kv_heads,
            HEAD_DIM=head_dim,
            HEADS_PAD=triton.next_power_of_2(num_kv_heads),
            HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
            KV_FORMAT=fmt,
            FP8_SCALE_STRIDE=1 if fmt == FP8 and cache_scale.numel() > 1 else 0,
            QUANT_MAX=quant.QUANT_MAX,
            FP8_MAX=quant.FP8_MAX,
            MIN_ABS_MAX=quant.MIN_ABS_MAX,
        )


def copy_blocks(caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """Same contract as ``kernels.dispatch.copy_blocks``; inputs already checked."""
    num_pairs = block_mapping.shape[0]
    if num_pairs == 0:
        return
    block_mapping = block_mapping.contiguous()
    for cache in caches:
        if cache.dtype == quant.FP8_DTYPE:  # moved as bytes: no conversion can touch a NaN's payload
            cache = cache.view(torch.uint8)
        block_numel = cache[0].numel()
        chunk = min(4096, triton.next_power_of_2(block_numel))
        _copy_blocks_kernel.on(cache.device)[(num_pairs, triton.cdiv(block_numel, chunk))](
            cache, block_mapping, block_numel, CHUNK=chunk
        )
