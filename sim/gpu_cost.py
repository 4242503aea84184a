"""The GPU cost models by name, and where a step's time goes.

- "calibrated" (the default): the analytic model of `sim.calibrated`, constants fitted to Vidur's
  measured profiles (`sim/calibration.json`), or for a GPU never measured, derived from its datasheet.
- "vidur:DIR": the measured non-attention times of DIR's `mlp.csv` for the model and GPU,
  interpolated between profiled token counts (`sim.vidur`), and attention measured by an
  `attention.csv` beside it where there is one; the rest (attention without one, LM head,
  communication) from the calibrated model.

`step_breakdown` splits one step's time into those parts; their sum is what the simulator charges.
"""
from __future__ import annotations

from .calibrated import Calibration, default_calibration, layer_seconds, lm_head_seconds
from .clock import TICKS_PER_S
from .cost_model import RooflineParams
from .hardware import HardwareSpec, get_hardware
from .models import ModelSpec, get_model
from .step_cost import BREAKDOWN_KEYS, LayeredCostModel, attention_pieces, layered_parts, measured_attention_pieces

VIDUR_PREFIX = "vidur:"
DEFAULT_OVERHEAD_S = RooflineParams().step_overhead_s
ALLREDUCE_LATENCY_S = RooflineParams().allreduce_latency_s


def gpu_cost_model(spec: str, model: str | ModelSpec, hardware: str | HardwareSpec, *, tp: int = 1,
                   kv_cache_dtype: str = "fp16", block_size: int = 16, step_overhead_s: float = DEFAULT_OVERHEAD_S,
                   calibration: Calibration | None = None) -> LayeredCostModel:
    """`spec` is "calibrated" or "vidur:DIR" (see the module doc)."""
    m, hw = get_model(model), get_hardware(hardware)
    cal = calibration or default_calibration()
    g = cal.gemm_for(hw)
    attention = attention_pieces(m, hw, tp, kv_cache_dtype, g.compute_efficiency, g.bandwidth_efficiency, g.latency_s)
    if spec == "calibrated":
        layer = lambda n: layer_seconds(m, hw, tp, n, cal)  # noqa: E731
        source = f"calibrated ({'fitted' if hw.name in cal.gemm else 'datasheet'} constants for {hw.name})"
    elif spec.startswith(VIDUR_PREFIX):
        # imported here: a run of the calibrated model never reads a profile (~4M instructions a start)
        from .vidur import find_profile, read_attention_profile, read_layer_profile

        profile = read_layer_profile(find_profile(spec[len(VIDUR_PREFIX):], m, hw), m)
        profile.at(tp, 1)  # the TP degree must be profiled: fail now, not at the first step
        layer = lambda n: profile.at(tp, n)  # noqa: E731
        source = f"measured {profile.path}"
        attention_file = profile.path.with_name("attention.csv")
        if attention_file.is_file():
            attention = measured_attention_pieces(m, hw, tp, kv_cache_dtype,
                                                  read_attention_profile(attention_file, m, tp))
            source += f", attention measured {attention_file}"
    else:
        raise ValueError(f"cost model {spec!r}: expected 'calibrated' or '{VIDUR_PREFIX}DIR'")
    parts = layered_parts(m, hw, tp, kv_cache_dtype, block_size, step_overhead_s, ALLREDUCE_LATENCY_S, layer,
                          lambda n: lm_head_seconds(m, hw, tp, n, cal), attention)
    return LayeredCostModel(parts, name=f"{spec}:{m.name}@{hw.name}x{tp}:{kv_cache_dtype}",
                            description=f"{m.name} on {tp} x {hw.name}, KV {kv_cache_dtype}: non-attention {source}")


def is_gpu_cost_model(spec) -> bool:
    return isinstance(spec, str) and (spec == "calibrated" or spec.startswith(VIDUR_PREFIX))


def step_breakdown(model: str | ModelSpec, hardware: str | HardwareSpec, *, tp: int = 1,
                   cost_model: str | LayeredCostModel = "calibrated", num_prefill_tokens: int = 0,
                   prefill_attention_pairs: int | None = None, num_decode_tokens: int = 0,
                   decode_context_sum: int = 0, num_seqs: int | None = None, kv_cache_dtype: str = "fp16"
                   ) -> dict[str, float]:
    """Seconds of one step by part (`BREAKDOWN_KEYS`); `total` is the simulator's step time.

    Left out, `prefill_attention_pairs` is that of one fresh prompt of `num_prefill_tokens`
    (n(n+1)/2) and `num_seqs` the decodes plus that one prompt: the batch a caller usually means."""
    cm = cost_model if isinstance(cost_model, LayeredCostModel) else \
        gpu_cost_model(cost_model, model, hardware, tp=tp, kv_cache_dtype=kv_cache_dtype)
    if prefill_attention_pairs is None:
        prefill_attention_pairs = num_prefill_tokens * (num_prefill_tokens + 1) // 2
    if num_seqs is None:
        num_seqs = num_decode_tokens + (1 if num_prefill_tokens else 0)
    ticks = cm.breakdown_ticks(num_prefill_tokens, prefill_attention_pairs, num_decode_tokens, decode_context_sum,
                               num_seqs)
    return {k: ticks[k] / TICKS_PER_S for k in BREAKDOWN_KEYS}
