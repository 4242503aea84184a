"""The calibrated analytic model of a layer's non-attention time, operator by operator.

Held against Vidur's measurements (`profiles/vidur`), the roofline misses four things, each
modelled here (`python -m sim calibrate` fits the constants and reports the error):

- A GEMM is never faster than a kernel's latency plus its weights streamed from memory, and near
  the ridge compute and memory do not overlap perfectly: time = latency + (memory^p +
  compute^p)^(1/p), a smooth maximum (p = infinity is the roofline's max; the fitted p is ~2).
- Compute comes in tiles and waves. A GEMM's output, M (tokens) x N, is cut into tiles, one per SM at a
  time: the tile grid against the SM count decides how many waves run and how full the last one is, so
  the tile's columns matter as much as its rows (a 4,096-wide shard is 32 tiles of 128 columns but 16 of
  256). cuBLAS picks among tile shapes per problem; the model takes the fastest of 64, 128 or 256 rows
  (a smaller power of two for fewer rows) by 128 or 256 columns, and when the tiles are fewer than the
  SMs, K is split to fill them. 129 tokens cost about what 192 or 256 do, and a small TP shard leaves
  SMs idle. On a GPU with thread block clusters (Hopper and later: `HardwareSpec.cta_cluster`) the row
  tiles come in pairs, the grid rounded up to whole clusters: Llama-2-70B's gate/up on 8 H100s at 520
  tokens is 9 rows of 64-row tiles, launched as 10.
- Norms, rotary embedding, activation and residual adds are memory-bound: a kernel floor plus bytes
  per element moved. The norms and the adds act on the full hidden state on every GPU of a
  tensor-parallel group (not split), rotary and the activation on the GPU's shard of heads and MLP.
- The LM head is a GEMM over the sampled positions only (the caller passes those rows).

Per GPU (fitted from its profiles, or for a GPU without any the mean of the fitted ones applied to
its own datasheet): the GEMM's fraction of peak FLOP/s and of peak bandwidth, and p. Shared by all
GPUs (launch latencies, and bytes relative to the datasheet bandwidth): the GEMM kernel's latency
(fitted jointly, the same in each GPU's constants) and each elementwise operator's floor and bytes
per element.
"""
from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from .hardware import HardwareSpec, get_hardware
from .models import ModelSpec, get_model

CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = ("attn_rope", "input_layernorm", "post_attention_layernorm", "mlp_act", "add")
TILES_M = (64, 128, 256)  # cuBLAS tile heights for many rows (fewer rows: a smaller power of two)
TILES_N = (128, 256)  # tile widths; every height with every width, the fastest taken
SPLIT_K_DEPTH = 256  # the least of K a split-K slice keeps


@dataclass(slots=True, frozen=True)
class GemmConstants:
    compute_efficiency: float  # of the datasheet's dense FP16 tensor FLOP/s, on full tiles
    bandwidth_efficiency: float  # of the datasheet's memory bandwidth, streaming the weights
    latency_s: float  # per GEMM kernel
    sharpness: float  # p of the smooth maximum of compute and memory time


@dataclass(slots=True, frozen=True)
class ElementwiseConstants:
    floor_s: float  # per kernel
    bytes_per_element: float  # effective bytes moved per element of the op's width, at datasheet bandwidth


@dataclass(slots=True)
class Calibration:
    """Fitted constants, and what they were fitted on (GPU and model names)."""

    gemm: dict[str, GemmConstants]  # by hardware name
    elementwise: dict[str, ElementwiseConstants]  # by operator (ELEMENTWISE_OPS)
    fitted_on: list[str]

    def gemm_for(self, hw: HardwareSpec) -> GemmConstants:
        """The GPU's fitted GEMM constants, or for a GPU never measured, the mean of the fitted ones:
        efficiencies are fractions of its own datasheet figures, so they carry over."""
        if hw.name in self.gemm:
            return self.gemm[hw.name]
        vals = list(self.gemm.values())
        return GemmConstants(**{f.name: float(np.mean([getattr(v, f.name) for v in vals]))
                                for f in fields(GemmConstants)})

    def to_json(self) -> str:
        return json.dumps({"fitted_on": self.fitted_on, "gemm": {k: asdict(v) for k, v in self.gemm.items()},
                           "elementwise": {k: asdict(v) for k, v in self.elementwise.items()}}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Calibration:
        d = json.loads(text)
        return cls({k: GemmConstants(**v) for k, v in d["gemm"].items()},
                   {k: ElementwiseConstants(**v) for k, v in d["elementwise"].items()}, d["fitted_on"])


@functools.cache
def default_calibration() -> Calibration:
    """The constants `python -m sim calibrate --write` fitted to all of `profiles/vidur`."""
    return Calibration.from_json(CALIBRATION_FILE.read_text(encoding="utf-8"))


def gemm_seconds(rows, n: int, k: int, hw: HardwareSpec, c: GemmConstants) -> np.ndarray:
    """A (rows x k) @ (k x n) FP16 GEMM (see the module doc); `rows` an array of token counts >= 1."""
    return gemm_seconds_of_work(*gemm_work(rows, n, k, hw), hw, c)


def gemm_work(rows, n: int, k: int, hw: HardwareSpec) -> tuple[np.ndarray, np.ndarray]:
    """(bytes moved, FLOPs the SMs spend) of `gemm_seconds`' GEMMs: what the constants do not change. A
    fit computes them once (`sim.calibrate.gemm_loss`): the tiling is most of the time of an evaluation."""
    m = np.asarray(rows, dtype=np.float64)
    memory = 2.0 * (n * k + m * (n + k))
    small = 2.0 ** np.ceil(np.log2(np.maximum(m, 16)))  # a power-of-two tile for fewer rows than tile_m
    compute = np.min([_tiled_compute(m, n, k, np.minimum(small, tm), tn, hw) for tm in TILES_M for tn in TILES_N],
                     axis=0)
    return memory, compute


def gemm_seconds_of_work(memory: np.ndarray, compute: np.ndarray, hw: HardwareSpec, c: GemmConstants) -> np.ndarray:
    """`gemm_seconds` from `gemm_work`'s bytes and FLOPs, under constants `c`."""
    memory = memory / (hw.memory_bandwidth * c.bandwidth_efficiency)
    compute = compute / (hw.peak_flops * c.compute_efficiency)
    p = c.sharpness
    return c.latency_s + (memory**p + compute**p) ** (1 / p)


def _tiled_compute(m, n, k, tile_m, tile_n: int, hw: HardwareSpec) -> np.ndarray:
    """FLOPs the SMs spend, idle ones included, with tiles of `tile_m` x `tile_n`: whole waves of tiles, the
    rows of tiles a whole number of clusters."""
    tiles = np.ceil(np.ceil(m / tile_m) / hw.cta_cluster) * hw.cta_cluster * np.ceil(n / tile_n)
    # split-K: the K dimension cut into slices fills the SMs a few tiles would leave idle
    splits = np.clip(hw.num_sms // tiles, 1, np.maximum(1, k // SPLIT_K_DEPTH))
    waves = np.ceil(tiles * splits / hw.num_sms)
    return waves * hw.num_sms * tile_m * tile_n * 2.0 * k / splits


def gemm_shapes(model: ModelSpec, tp: int) -> dict[str, tuple[int, int]]:
    """(n, k) of each of a layer's GEMMs on one GPU of `tp`: QKV and gate/up split their outputs,
    the output and down projections their inputs (Megatron-style column then row parallelism)."""
    m = model
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    return {"attn_pre_proj": (-(-(q + 2 * kv) // tp), m.hidden_size), "attn_post_proj": (m.hidden_size, -(-q // tp)),
            "mlp_up_proj": (-(-2 * m.intermediate_size // tp), m.hidden_size),
            "mlp_down_proj": (m.hidden_size, -(-m.intermediate_size // tp))}


def elementwise_widths(model: ModelSpec, tp: int) -> dict[str, float]:
    """Elements per token each memory-bound operator reads and writes, on one GPU of `tp`."""
    m = model
    h = m.hidden_size
    return {"attn_rope": 2 * (m.num_heads + m.num_kv_heads) * m.head_dim / tp,  # q and k, in and out
            "input_layernorm": 2 * h, "post_attention_layernorm": 2 * h,  # not split: every GPU holds the residual
            "mlp_act": 3 * m.intermediate_size / tp,  # gate and up in, their product out
            "add": 3 * h}  # two in, one out


def layer_op_seconds(model: str | ModelSpec, hardware: str | HardwareSpec, tp: int, tokens,
                     calibration: Calibration | None = None) -> dict[str, np.ndarray]:
    """One layer's non-attention operators on one GPU of `tp`, seconds each, at `tokens` (array)."""
    m, hw = get_model(model), get_hardware(hardware)
    cal = calibration or default_calibration()
    g = cal.gemm_for(hw)
    n = np.asarray(tokens, dtype=np.float64)
    out = {op: gemm_seconds(n, nn, kk, hw, g) for op, (nn, kk) in gemm_shapes(m, tp).items()}
    for op, width in elementwise_widths(m, tp).items():
        e = cal.elementwise[op]
        out[op] = e.floor_s + n * width * e.bytes_per_element / hw.memory_bandwidth
    return out


def layer_seconds(model, hardware, tp: int, tokens, calibration: Calibration | None = None) -> np.ndarray:
    """One layer's non-attention time: what Vidur's mlp.csv measures, summed."""
    return sum(layer_op_seconds(model, hardware, tp, tokens, calibration).values())


def lm_head_seconds(model, hardware, tp: int, rows, calibration: Calibration | None = None) -> np.ndarray:
    """The LM head over `rows` sampled positions (the vocabulary split over `tp`)."""
    m, hw = get_model(model), get_hardware(hardware)
    g = (calibration or default_calibration()).gemm_for(hw)
    return gemm_seconds(rows, -(-m.vocab_size // tp), m.hidden_size, hw, g)
