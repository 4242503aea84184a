"""Attention over the paged KV cache: the one place the engine calls the kernels.

A step's batch is flat: the new tokens of every scheduled sequence, one after the other. What
the kernels need to find each token's sequence, its cache slots and its context is built once
per step by the runner (`AttentionMetadata`) and shared by all layers; each layer owns its
cache pair, bound by the runner when the KV tensors are allocated.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

import kernels


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # int64 [num_tokens]: flat slot (block_id * block_size + offset) of each new token
    block_table: torch.Tensor  # int32 [num_seqs, max_blocks]
    seq_lens: torch.Tensor  # int32 [num_seqs]: context length after this step
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]: cumulative new-token counts
    # The kernels check their arguments, reading the metadata back to the host (a device sync):
    # once per step is enough, since every layer gets the same metadata and same-shaped caches.
    checked: bool = False


class PagedAttention(nn.Module):
    """Writes this step's K/V into their slots, then attends causally over each sequence's cache."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale
        self.key_cache: torch.Tensor | None = None  # [num_blocks, block_size, num_kv_heads, head_dim]
        self.value_cache: torch.Tensor | None = None
        self.k_scale: torch.Tensor | None = None  # a quantized cache's scales (kernels.quant); None for a float one
        self.v_scale: torch.Tensor | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        check = not meta.checked
        scales = {"k_scale": self.k_scale, "v_scale": self.v_scale}
        kernels.reshape_and_cache(k, v, self.key_cache, self.value_cache, meta.slot_mapping, validate=check, **scales)
        out = kernels.paged_attention(q, self.key_cache, self.value_cache, meta.block_table, meta.seq_lens,
                                      meta.query_start_loc, self.scale, validate=check, **scales)
        meta.checked = True
        return out
