"""The KV tensors the core's block ids point into, and the block moves the core asks for.

All layers' caches live in one tensor `[num_layers, 2, num_blocks, block_size, num_kv_heads,
head_dim]`: each layer's key and value caches are contiguous views of it (the layout the
kernels take), and a swap moves a block of every layer with one indexing operation. The host
pool for swapping is the same shape with `num_cpu_blocks` blocks, in pinned memory on CUDA so
the copies can overlap.

`kv_cache_dtype` (see `kernels.quant`) picks how K/V are stored: "auto" in the model's dtype,
"fp16" in float16, "int8" and "int4" (packed, `head_dim // 2` bytes a head) with float32 scales
per token kept in a second tensor shaped like the first (`[..., num_kv_heads]`, or
`[..., num_kv_heads, num_groups]` for int4) that moves with its blocks, and "fp8" (e4m3) with
one static scale per layer's K and V, 1.0 (vLLM's default for a checkpoint without calibrated
scales). Measured on SmolLM2-135M (8 prompts): |K| <= 19 and |V| <= 10.2, far below e4m3's 448,
and 2.9% of the values under 2**-6, where e4m3 turns subnormal (absolute error <= 2**-10); the
rest carry e4m3's relative error of 2**-4 whatever the scale, so a calibrated scale would buy
little.

`swap_compression` ("lz4" or "lz4-shuffle", `paged.engine.swap_compression`) keeps the host pool
as one LZ4 frame per swapped block instead of a tensor: the core still counts host blocks, and
each takes only its compressed bytes.
"""
from __future__ import annotations

import torch

import kernels
from kernels import quant

from .engine_config import KV_CACHE_DTYPES
from .models import ModelConfig
from .swap_compression import CompressedHostPool


def kv_storage_dtype(kv_cache_dtype: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype the cache tensor holds for `kv_cache_dtype` under a model computing in `dtype`."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r}: expected one of {list(KV_CACHE_DTYPES)}")
    if kv_cache_dtype == "auto":
        return dtype
    return quant.CACHE_DTYPES["float16" if kv_cache_dtype == "fp16" else kv_cache_dtype]


def _scale_shape(config: ModelConfig, storage: torch.dtype) -> tuple[int, ...] | None:
    """The per-token scales' trailing shape, after [layers, 2, blocks, block_size]; None without per-token scales."""
    if storage == quant.QUANT_DTYPE:
        return (config.num_key_value_heads,)
    if storage == quant.INT4_DTYPE:
        return config.num_key_value_heads, config.head_dim // quant.int4_group_size(config.head_dim)
    return None


class CacheEngine:
    def __init__(self, config: ModelConfig, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device, kv_cache_dtype: str = "auto",
                 swap_compression: str | None = None) -> None:
        storage = kv_storage_dtype(kv_cache_dtype, dtype)
        head_dim = config.head_dim // 2 if storage == quant.INT4_DTYPE else config.head_dim
        lead = (config.num_hidden_layers, 2)
        tail = (block_size, config.num_key_value_heads, head_dim)
        scale_tail = _scale_shape(config, storage)
        pinned = device.type == "cuda"
        # Zeros, not empty: a fresh cache holds no NaN that a kernel bug could let through.
        self.device_cache = torch.zeros((*lead, num_gpu_blocks, *tail), dtype=storage, device=device)
        self.device_scales = None if scale_tail is None else torch.zeros((*lead, num_gpu_blocks, block_size,
                                                                          *scale_tail), device=device)
        self.host_cache = self.host_scales = self.host_pool = None
        if num_cpu_blocks and swap_compression:
            self.host_pool = CompressedHostPool(swap_compression)
        elif num_cpu_blocks:
            self.host_cache = torch.zeros((*lead, num_cpu_blocks, *tail), dtype=storage, pin_memory=pinned)
            if scale_tail is not None:
                self.host_scales = torch.zeros((*lead, num_cpu_blocks, block_size, *scale_tail), pin_memory=pinned)
        # fp8: one static scale per layer's K and V, never swapped (it belongs to the tensor, not a block).
        self.fp8_scales = torch.ones((*lead, 1), device=device) if storage == quant.FP8_DTYPE else None
        self.device = device

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype, kv_cache_dtype: str = "auto") -> int:
        """Device bytes of one block, every layer's K and V, per-token scales included."""
        storage = kv_storage_dtype(kv_cache_dtype, dtype)
        group_size = quant.int4_group_size(config.head_dim) if storage == quant.INT4_DTYPE else None
        per_layer = quant.cache_bytes_per_token(config.num_key_value_heads, config.head_dim, storage, group_size)
        return block_size * config.num_hidden_layers * per_layer

    def layer_caches(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]]:
        """(key_cache, value_cache, k_scale, v_scale) of each layer, as the kernels take them (scales None
        for a float cache)."""
        scales = self.device_scales if self.fp8_scales is None else self.fp8_scales
        if scales is None:
            return [(layer[0], layer[1], None, None) for layer in self.device_cache]
        return [(layer[0], layer[1], scale[0], scale[1])
                for layer, scale in zip(self.device_cache, scales, strict=True)]

    def swapped_tensors(self) -> list[torch.Tensor]:
        """The device tensors a swap moves blocks of (dimension 2 is the block): the cache, and its per-token scales."""
        return [self.device_cache, *(() if self.device_scales is None else (self.device_scales,))]

    def swap_out(self, mapping: list[tuple[int, int]]) -> None:
        """Copy (device block, host block) pairs to the host, before the blocks are reused."""
        if mapping and self.host_pool is not None:
            src, dst = (list(ids) for ids in zip(*mapping, strict=True))
            blocks = [tensor[:, :, src].to("cpu") for tensor in self.swapped_tensors()]
            for i, host_block in enumerate(dst):
                self.host_pool.put(host_block, [b[:, :, i] for b in blocks])
        elif mapping:
            src, dst = (list(ids) for ids in zip(*mapping, strict=True))
            self.host_cache[:, :, dst] = self.device_cache[:, :, src].to("cpu")
            if self.device_scales is not None:
                self.host_scales[:, :, dst] = self.device_scales[:, :, src].to("cpu")

    def swap_in(self, mapping: list[tuple[int, int]]) -> None:
        """Copy (host block, device block) pairs back to the device."""
        if mapping and self.host_pool is not None:
            src, dst = (list(ids) for ids in zip(*mapping, strict=True))
            moved = self.swapped_tensors()
            blocks = [self.host_pool.take(host_block, [t[:, :, 0] for t in moved]) for host_block in src]
            for i, tensor in enumerate(moved):
                tensor[:, :, dst] = torch.stack([b[i] for b in blocks], dim=2).to(self.device)
        elif mapping:
            src, dst = (list(ids) for ids in zip(*mapping, strict=True))
            self.device_cache[:, :, dst] = self.host_cache[:, :, src].to(self.device)
            if self.device_scales is not None:
                self.device_scales[:, :, dst] = self.host_scales[:, :, src].to(self.device)

    def copy(self, mapping: list[tuple[int, int]]) -> None:
        """Copy-on-write: (src, dst) block pairs within the device pool, in every layer."""
        if mapping:
            pairs = torch.tensor(mapping, dtype=torch.int64, device=self.device)
            for key_cache, value_cache, k_scale, v_scale in self.layer_caches():
                kernels.copy_blocks(key_cache, value_cache, pairs, k_scale=k_scale, v_scale=v_scale)
