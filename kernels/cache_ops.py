"""Cache writes in Triton: ``reshape_and_cache`` (new K/V into their slots) and ``copy_blocks`` (copy-on-write).

``reshape_and_cache`` runs one program per token, all KV heads at once; a slot of -1 (a padding
token, or one whose K/V need not be kept) writes nothing. K and V are two launches of the same
kernel, so the write logic, quantization included, exists once. For an int8 cache the kernel
computes each head's scale and rounds exactly as ``kernels.quant.quantize`` does, in the same
order of operations, so the Triton and torch backends store the same bytes.

``copy_blocks`` copies whole blocks, which are contiguous runs of
``block_size * num_kv_heads * head_dim`` elements in the vLLM layout: one program per (pair,
chunk of a block), the same kernel for K, V and their scales.
"""

import torch
import triton
import triton.language as tl

from kernels import quant
from kernels.jit import Kernel


@Kernel
def _write_slots_kernel(
    new_ptr,  # [num_tokens, num_kv_heads, head_dim]
    cache_ptr,  # [num_blocks * block_size, num_kv_heads, head_dim], contiguous
    cache_scale_ptr,  # [num_blocks * block_size, num_kv_heads] float32 (quantized only)
    slot_mapping_ptr,
    stride_new_token,
    stride_new_head,
    stride_new_dim,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    QUANTIZED: tl.constexpr,
    QUANT_MAX: tl.constexpr,
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
    if QUANTIZED:
        new = new.to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(new), axis=1), MIN_ABS_MAX) / QUANT_MAX
        scaled = new / scale[:, None]
        rounded = scaled + tl.where(scaled >= 0.0, 0.5, -0.5)
        rounded = tl.minimum(tl.maximum(rounded, -QUANT_MAX), QUANT_MAX)
        tl.store(cache_ptr + cache_offset, rounded.to(tl.int8), mask=mask)
        tl.store(cache_scale_ptr + slot * NUM_KV_HEADS + heads, scale, mask=heads < NUM_KV_HEADS)
    else:
        tl.store(cache_ptr + cache_offset, new, mask=mask)


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
    launch = _write_slots_kernel.on(key.device)
    slot_mapping = slot_mapping.contiguous()  # read as a packed array
    for new, cache, cache_scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        launch[(num_tokens,)](
            new,
            cache,
            cache if cache_scale is None else cache_scale,
            slot_mapping,
            new.stride(0),
            new.stride(1),
            new.stride(2),
            NUM_KV_HEADS=num_kv_heads,
            HEAD_DIM=head_dim,
            HEADS_PAD=triton.next_power_of_2(num_kv_heads),
            HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
            QUANTIZED=cache_scale is not None,
            QUANT_MAX=quant.QUANT_MAX,
            MIN_ABS_MAX=quant.MIN_ABS_MAX,
        )


def copy_blocks(caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """Same contract as ``kernels.dispatch.copy_blocks``; inputs already checked."""
    num_pairs = block_mapping.shape[0]
    if num_pairs == 0:
        return
    block_mapping = block_mapping.contiguous()
    for cache in caches:
        block_numel = cache[0].numel()
        chunk = min(4096, triton.next_power_of_2(block_numel))
        _copy_blocks_kernel.on(cache.device)[(num_pairs, triton.cdiv(block_numel, chunk))](
            cache, block_mapping, block_numel, CHUNK=chunk
        )
