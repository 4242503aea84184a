"""The KV tensors the core's block ids point into, and the block moves the core asks for.

All layers' caches live in one tensor `[num_layers, 2, num_blocks, block_size, num_kv_heads,
head_dim]`: each layer's key and value caches are contiguous views of it (the layout the
kernels take), and a swap moves a block of every layer with one indexing operation. The host
pool for swapping is the same shape with `num_cpu_blocks` blocks, in pinned memory on CUDA so
the copies can overlap.
"""
from __future__ import annotations

import torch

import kernels

from .models import ModelConfig


class CacheEngine:
    def __init__(self, config: ModelConfig, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (config.num_hidden_layers, 2, num_gpu_blocks, block_size, config.num_key_value_heads, config.head_dim)
        # Zeros, not empty: a fresh cache holds no NaN that a kernel bug could let through.
        self.device_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.host_cache = None
        if num_cpu_blocks:
            self.host_cache = torch.zeros((*shape[:2], num_cpu_blocks, *shape[3:]), dtype=dtype,
                                          pin_memory=device.type == "cuda")
        self.device = device

    @staticmethod
    def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        return block_size * config.kv_bytes_per_token(torch.empty((), dtype=dtype).element_size())

    def layer_caches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(key_cache, value_cache) of each layer, `[num_blocks, block_size, num_kv_heads, head_dim]`."""
        return [(layer[0], layer[1]) for layer in self.device_cache]

    def swap_out(self, mapping: list[tuple[int, int]]) -> None:
        """Copy (device block, host block) pairs to the host, before the blocks are reused."""
        if mapping:
            src, dst = zip(*mapping, strict=True)
            self.host_cache[:, :, list(dst)] = self.device_cache[:, :, list(src)].to("cpu")

    def swap_in(self, mapping: list[tuple[int, int]]) -> None:
        """Copy (host block, device block) pairs back to the device."""
        if mapping:
            src, dst = zip(*mapping, strict=True)
            self.device_cache[:, :, list(dst)] = self.host_cache[:, :, list(src)].to(self.device)

    def copy(self, mapping: list[tuple[int, int]]) -> None:
        """Copy-on-write: (src, dst) block pairs within the device pool, in every layer."""
        if mapping:
            pairs = torch.tensor(mapping, dtype=torch.int64, device=self.device)
            for key_cache, value_cache in self.layer_caches():
                kernels.copy_blocks(key_cache, value_cache, pairs)
