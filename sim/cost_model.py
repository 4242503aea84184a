"""Step time of a batch: the one interface behind which the GPU is replaced.

A cost model here is a maximum of linear functions of the batch's aggregate features
(`SchedulerOutput` keeps them, so nothing walks the batch):

    step = max over pieces p of  c_p . (1, prefill tokens, prefill attention pairs,
                                         decode tokens, decode context sum, sequences)
           + swap_ticks_per_block * blocks swapped

with integer coefficients in ticks (picoseconds) per unit. The roofline model is two pieces
(compute-bound, memory-bound) sharing additive terms; a fitted profile is one piece. The
form is what the fast path needs: in k steps of a fixed decode batch only the context sum
moves, by the batch size each step, so each piece is a line in the step index and the sum
of k steps has a closed form (`sim.window`), exact because everything is an integer.
"""
from __future__ import annotations

from dataclasses import dataclass

from .clock import TICKS_PER_S
from .hardware import HardwareSpec, get_hardware
from .models import ModelSpec, get_kv_dtype, get_model

FEATURES = ("intercept", "num_prefill_tokens", "prefill_attention_pairs", "num_decode_tokens",
            "decode_context_sum", "num_seqs")


def _ticks(seconds: float) -> int:
    return round(seconds * TICKS_PER_S)


class CostModel:
    """Step time = max over `pieces` of a linear function of the features (see the module doc)."""

    __slots__ = ("name", "pieces", "swap_ticks_per_block", "description")

    def __init__(self, pieces_s: list[tuple[float, ...]], swap_s_per_block: float = 0.0, name: str = "",
                 description: str = "") -> None:
        if not pieces_s or any(len(p) != len(FEATURES) for p in pieces_s):
            raise ValueError(f"a cost model needs at least one piece of {len(FEATURES)} coefficients {FEATURES}")
        if any(c < 0 for p in pieces_s for c in p):
            raise ValueError(f"cost model coefficients must be >= 0, got {pieces_s}")
        # A step always takes at least one tick, so simulated time always moves.
        self.pieces = _undominated([tuple(_ticks(c) for c in p) for p in pieces_s] + [(1, 0, 0, 0, 0, 0)])
        self.swap_ticks_per_block = _ticks(swap_s_per_block)
        self.name = name
        self.description = description

    def step_ticks(self, out) -> int:
        """Duration of the step `out` (a SchedulerOutput) in ticks."""
        x1, x2, x3, x4 = out.num_prefill_tokens, out.prefill_attention_pairs, out.num_decode_tokens, \
            out.decode_context_sum
        x5 = x3 + len(out.prefill_requests)  # every decode slot costs, live or (static batching) padding
        best = 0
        for c0, c1, c2, c3, c4, c5 in self.pieces:
            v = c0 + c1 * x1 + c2 * x2 + c3 * x3 + c4 * x4 + c5 * x5
            if v > best:
                best = v
        swapped = len(out.blocks_to_swap_in) + len(out.blocks_to_swap_out)
        return best + self.swap_ticks_per_block * swapped if swapped else best

    def step_seconds(self, num_prefill_tokens: int = 0, prefill_attention_pairs: int = 0, num_decode_tokens: int = 0,
                     decode_context_sum: int = 0, num_seqs: int = 0, num_swapped_blocks: int = 0) -> float:
        """The same figure from plain numbers, in seconds (for plots and checks)."""
        x = (1, num_prefill_tokens, prefill_attention_pairs, num_decode_tokens, decode_context_sum, num_seqs)
        best = max(sum(c * v for c, v in zip(p, x, strict=True)) for p in self.pieces)
        return (best + self.swap_ticks_per_block * num_swapped_blocks) / TICKS_PER_S

    def decode_lines(self, num_seqs: int, context_sum: int) -> list[tuple[int, int]]:
        """Step j (0-based) of a fixed batch of `num_seqs` decodes whose context sum is
        `context_sum` at step 0 takes max over the returned (a, b) of a + b*j ticks."""
        B = num_seqs
        lines = [(c0 + (c3 + c5) * B + c4 * context_sum, c4 * B) for c0, _, _, c3, c4, c5 in self.pieces]
        if len(lines) == 2:  # the roofline: usually one of compute and memory bounds the whole window
            (a1, b1), (a2, b2) = lines
            if a1 <= a2 and b1 <= b2:
                return lines[1:]
            if a2 <= a1 and b2 <= b1:
                return lines[:1]
            return lines
        return _undominated(lines)


def _undominated(pieces: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Drop pieces no larger than another in every coefficient: they never set the maximum
    (features are >= 0), and fewer pieces make every step cheaper to cost."""
    if len(pieces) == 1:
        return pieces
    keep = []
    for i, p in enumerate(pieces):
        if not any(j != i and all(x <= y for x, y in zip(p, q, strict=True)) and (q != p or j < i)
                   for j, q in enumerate(pieces)):
            keep.append(p)
    return keep


@dataclass(slots=True)
class RooflineParams:
    """The roofline's knobs; defaults are typical of vLLM on datacenter GPUs.

    `mfu_efficiency`: fraction of peak tensor FLOP/s a large GEMM reaches (50-65% is what
    prefill-heavy serving reports, e.g. Sarathi-Serve). `bandwidth_efficiency`: fraction of
    peak HBM bandwidth a streaming read reaches (~80% in STREAM-like measurements).
    `step_overhead_s`: the CPU side of an iteration (scheduling, input preparation, sampling,
    kernel launches), a few ms on 7B-class models without CUDA graphs. `allreduce_latency_s`:
    a small NCCL all-reduce over NVLink (nccl-tests), paid twice per layer under tensor parallelism.
    """

    mfu_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    step_overhead_s: float = 0.002
    allreduce_latency_s: float = 8e-6


def roofline_cost_model(model: str | ModelSpec, hardware: str | HardwareSpec, *, tp: int = 1,
                        kv_cache_dtype: str = "fp16", block_size: int = 16,
                        params: RooflineParams | None = None) -> CostModel:
    """Per step: time = max(FLOPs / (peak * mfu), bytes / (bandwidth * efficiency))
    + overhead + tensor-parallel all-reduce + KV dequantization + swap.

    FLOPs = 2 * params * tokens + 4 * heads * head_dim * layers per attention pair (prefill
    pairs, decode context). Bytes = the weights once per step + the KV of every decode
    context token read + the KV of every new token written. Tensor parallelism splits FLOPs,
    bytes and KV over `tp` GPUs and adds two ring all-reduces of tokens * hidden * 2 bytes
    per layer. A quantized KV cache reads fewer bytes and pays `dequant_ops` FP32 operations
    per element read, not overlapped with the read. Prefill reads of earlier context (chunked
    prefill, prefix hits) are left out: prefill is compute-bound.
    """
    m, hw = get_model(model), get_hardware(hardware)
    p = params or RooflineParams()
    dt = get_kv_dtype(kv_cache_dtype)
    flops_rate = tp * hw.peak_flops * p.mfu_efficiency
    bytes_rate = tp * hw.memory_bandwidth * p.bandwidth_efficiency
    kv_bytes = m.kv_bytes_per_token(kv_cache_dtype)
    per_token_flops = 2 * m.num_params / flops_rate
    per_pair = m.attention_flops_per_pair / flops_rate
    compute = (0.0, per_token_flops, per_pair, per_token_flops, per_pair, 0.0)
    kv_write = kv_bytes / bytes_rate
    memory = (m.weight_bytes / bytes_rate, kv_write, 0.0, kv_write, kv_bytes / bytes_rate, 0.0)
    per_token_comm, fixed_comm = tensor_parallel_communication(m, hw, tp, p.allreduce_latency_s)
    extra = (p.step_overhead_s + fixed_comm, per_token_comm, 0.0, per_token_comm, dequantization(m, hw, tp, dt.name),
             0.0)
    pieces = [tuple(a + b for a, b in zip(piece, extra, strict=True)) for piece in (compute, memory)]
    swap = swap_seconds_per_block(m, hw, tp, dt.name, block_size)
    return CostModel(pieces, swap, name=f"roofline:{m.name}@{hw.name}x{tp}:{dt.name}",
                     description=f"roofline {m.name} on {tp} x {hw.name}, KV {dt.name}, {p}")


def tensor_parallel_communication(model: ModelSpec, hw: HardwareSpec, tp: int,
                                  allreduce_latency_s: float) -> tuple[float, float]:
    """(seconds per token, seconds per step) of two ring all-reduces of the hidden state per layer."""
    if tp == 1:
        return 0.0, 0.0
    m = model
    per_token = 2 * m.num_layers * 2 * (tp - 1) / tp * m.hidden_size * 2 / hw.interconnect_bandwidth
    return per_token, 2 * m.num_layers * allreduce_latency_s


def dequantization(model: ModelSpec, hw: HardwareSpec, tp: int, kv_cache_dtype: str) -> float:
    """Seconds per context token read of dequantizing a quantized KV cache (FP32, off the tensor cores)."""
    return model.kv_elements_per_token * get_kv_dtype(kv_cache_dtype).dequant_ops / (tp * hw.vector_flops)


def swap_seconds_per_block(model: ModelSpec, hw: HardwareSpec, tp: int, kv_cache_dtype: str, block_size: int) -> float:
    """One block's KV over PCIe, each GPU of the group moving its share."""
    return model.kv_bytes_per_token(kv_cache_dtype) * block_size / (tp * hw.pcie_bandwidth)
