"""Rotary position embedding (RoPE), "neox" layout: dimension i pairs with i + head_dim / 2.

The cos/sin table is computed once for every position up to the model's limit, in float32 as
Hugging Face computes it per forward, so that a token's rotation does not depend on which batch
it was computed in — the property that makes paged and reference outputs agree. The model looks
the rows of a step up once and every layer applies them.
"""
from __future__ import annotations

import math

import torch
from torch import nn

ROPE_TYPES = ("default", "linear", "llama3")


def _inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type={rope_type!r} is not supported: expected one of {ROPE_TYPES}")
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the middle band blended.
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, blended, scaled)
    return inv_freq


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: dict | None) -> None:
        super().__init__()
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), _inv_freq(head_dim, theta, scaling))
        self.register_buffer("cos", freqs.cos(), persistent=False)  # [max_position, head_dim / 2], float32
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of each token's position, [num_tokens, 1, head_dim / 2], broadcast over heads."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [num_tokens, num_heads, head_dim] rotated by the angles whose cos and sin are given."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
