"""A step's time as the sum of what a forward pass does: the default cost model for GPUs.

    step = layers x non-attention(tokens)            the calibrated model, or a measured profile
         + LM head(sampled positions)                one row per sequence, not per prefill token
         + max(attention compute, attention memory)  linear in prefill pairs and decode context
         + tensor-parallel all-reduces(tokens) + CPU overhead (+ swap)

Non-attention and LM head are arbitrary functions of the token count and of the sequence count
(tile steps, kernel floors, interpolated measurements): both are fixed within a fast-path window
(a fixed decode batch), where only the context sum moves. So `decode_lines` stays exact: the
attention lines (`CostModel.pieces`) plus a constant. What it costs: each distinct token count
and sequence count is computed once, vectorised, into integer tables grown by doubling; a step
is then two table reads more than the roofline's.

Attention is not in Vidur's mlp.csv. From an attention.csv beside it, it is the measured line
(`sim.vidur.read_attention_profile`); without one (as in `profiles/vidur`), the roofline's
attention (FLOPs of every pair at the GEMMs' fitted compute efficiency, the KV read at their
fitted bandwidth efficiency, KV dequantization) plus a kernel latency per layer.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .clock import TICKS_PER_S
from .cost_model import CostModel, dequantization, swap_seconds_per_block, tensor_parallel_communication
from .hardware import HardwareSpec, get_hardware
from .models import ModelSpec, get_model

BREAKDOWN_KEYS = ("non_attention", "attention", "lm_head", "communication", "overhead", "swap", "total")


class _Table:
    """ticks(n) of a vectorised seconds function, n = 0, 1, 2, ...; n = 0 costs nothing. Read with
    `at(n)`, a plain method: a call through `__call__` costs twice as much, at every step."""

    __slots__ = ("fn", "ticks")

    def __init__(self, fn: Callable[[np.ndarray], np.ndarray]) -> None:
        self.fn = fn
        self.ticks: list[int] = [0]

    def at(self, n: int) -> int:
        t = self.ticks
        if n >= len(t):
            hi = max(n + 1, 2 * len(t), 64)
            seconds = self.fn(np.arange(len(t), hi, dtype=np.float64))
            t.extend(int(v) for v in np.rint(np.asarray(seconds) * TICKS_PER_S))
        return t[n]


@dataclass(slots=True, frozen=True)
class StepParts:
    """How a step's seconds come about (`LayeredCostModel`); `fixed_s` is paid by every step."""

    non_attention_s: Callable[[np.ndarray], np.ndarray]  # all layers, by tokens in the step
    lm_head_s: Callable[[np.ndarray], np.ndarray]  # by sampled positions
    attention_pieces_s: list[tuple[float, ...]]  # CostModel pieces: attention's compute and memory bounds
    communication_per_token_s: float
    communication_fixed_s: float  # per step, when tp > 1
    overhead_s: float
    swap_s_per_block: float


class LayeredCostModel(CostModel):
    """The sum in the module doc; `pieces` are attention's."""

    __slots__ = ("non_attention", "lm_head", "comm_per_token", "comm_fixed", "overhead", "fixed")

    def __init__(self, parts: StepParts, name: str = "", description: str = "") -> None:
        super().__init__(parts.attention_pieces_s, parts.swap_s_per_block, name, description)
        self.non_attention = _Table(parts.non_attention_s)
        self.lm_head = _Table(parts.lm_head_s)
        self.comm_per_token = round(parts.communication_per_token_s * TICKS_PER_S)
        self.comm_fixed = round(parts.communication_fixed_s * TICKS_PER_S)
        self.overhead = round(parts.overhead_s * TICKS_PER_S)
        self.fixed = self.comm_fixed + self.overhead

    def _attention(self, x1: int, x2: int, x3: int, x4: int, x5: int) -> int:
        best = 0
        for c0, c1, c2, c3, c4, c5 in self.pieces:
            v = c0 + c1 * x1 + c2 * x2 + c3 * x3 + c4 * x4 + c5 * x5
            if v > best:
                best = v
        return best

    def step_ticks(self, out) -> int:
        x1, x3 = out.num_prefill_tokens, out.num_decode_tokens
        x5 = x3 + len(out.prefill_requests)
        tokens = x1 + x3
        t = (self._attention(x1, out.prefill_attention_pairs, x3, out.decode_context_sum, x5)
             + self.non_attention.at(tokens) + self.lm_head.at(x5) + self.comm_per_token * tokens + self.fixed)
        swapped = len(out.blocks_to_swap_in) + len(out.blocks_to_swap_out)
        return t + self.swap_ticks_per_block * swapped if swapped else t

    def breakdown_ticks(self, num_prefill_tokens: int = 0, prefill_attention_pairs: int = 0,
                        num_decode_tokens: int = 0, decode_context_sum: int = 0, num_seqs: int = 0,
                        num_swapped_blocks: int = 0) -> dict[str, int]:
        tokens = num_prefill_tokens + num_decode_tokens
        parts = {"non_attention": self.non_attention.at(tokens),
                 "attention": self._attention(num_prefill_tokens, prefill_attention_pairs, num_decode_tokens,
                                              decode_context_sum, num_seqs),
                 "lm_head": self.lm_head.at(num_seqs), "communication": self.comm_fixed + self.comm_per_token * tokens,
                 "overhead": self.overhead, "swap": self.swap_ticks_per_block * num_swapped_blocks}
        return {**parts, "total": sum(parts.values())}

    def step_seconds(self, num_prefill_tokens: int = 0, prefill_attention_pairs: int = 0, num_decode_tokens: int = 0,
                     decode_context_sum: int = 0, num_seqs: int = 0, num_swapped_blocks: int = 0) -> float:
        return self.breakdown_ticks(num_prefill_tokens, prefill_attention_pairs, num_decode_tokens, decode_context_sum,
                                    num_seqs, num_swapped_blocks)["total"] / TICKS_PER_S

    def decode_lines(self, num_seqs: int, context_sum: int) -> list[tuple[int, int]]:
        B = num_seqs
        const = self.non_attention.at(B) + self.lm_head.at(B) + self.comm_per_token * B + self.fixed
        return [(a + const, b) for a, b in super().decode_lines(B, context_sum)]


def attention_pieces(model: ModelSpec, hw: HardwareSpec, tp: int, kv_cache_dtype: str, compute_efficiency: float,
                     bandwidth_efficiency: float, latency_s: float) -> list[tuple[float, ...]]:
    """Attention's compute bound and memory bound as CostModel pieces (see the module doc)."""
    m = model
    flops = tp * hw.peak_flops * compute_efficiency
    bw = tp * hw.memory_bandwidth * bandwidth_efficiency
    kv = m.kv_bytes_per_token(kv_cache_dtype)
    pair = m.attention_flops_per_pair / flops
    dequant = dequantization(m, hw, tp, kv_cache_dtype)
    floor = m.num_layers * latency_s
    return [(floor, 0.0, pair, 0.0, pair + dequant, 0.0),
            (floor, kv / bw, 0.0, kv / bw, kv / bw + dequant, 0.0)]


def layered_parts(model: str | ModelSpec, hardware: str | HardwareSpec, tp: int, kv_cache_dtype: str, block_size: int,
                  step_overhead_s: float, allreduce_latency_s: float,
                  non_attention_layer_s: Callable[[np.ndarray], np.ndarray],
                  lm_head_s: Callable[[np.ndarray], np.ndarray], attention_pieces_s: list[tuple[float, ...]]
                  ) -> StepParts:
    """The parts of a step for `model` on `tp` x `hardware`, given one layer's non-attention seconds."""
    m, hw = get_model(model), get_hardware(hardware)
    per_token, fixed = tensor_parallel_communication(m, hw, tp, allreduce_latency_s)
    return StepParts(lambda n: m.num_layers * non_attention_layer_s(n), lm_head_s, attention_pieces_s, per_token,
                     fixed, step_overhead_s, swap_seconds_per_block(m, hw, tp, kv_cache_dtype, block_size))


def measured_attention_pieces(model: ModelSpec, hw: HardwareSpec, tp: int, kv_cache_dtype: str,
                              layer_coefficients_s: tuple[float, ...]) -> list[tuple[float, ...]]:
    """One piece from one layer's measured attention line (`sim.vidur.read_attention_profile`), all
    layers; a quantized KV cache adds its dequantization per context token (the profile is fp16)."""
    c0, c1, c2, c3, c4 = (model.num_layers * c for c in layer_coefficients_s)
    return [(c0, c1, c2, c3, c4 + dequantization(model, hw, tp, kv_cache_dtype), 0.0)]
