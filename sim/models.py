"""Model specs (from each model's Hugging Face config.json) and KV-cache data types.

The simulator needs only shapes: parameters (weights to read each step, 2 FLOPs per parameter
per token), layers, attention heads and KV heads, head dim (attention FLOPs and KV bytes per
token), hidden size (tensor-parallel all-reduce volume), the MLP's intermediate size and the
vocabulary (the calibrated cost model times each matmul by its shape) and the context length
the model was trained for (the default `max_model_len`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .catalog import lookup
from .hf_config import is_config_path, read_hf_config


@dataclass(slots=True, frozen=True)
class ModelSpec:
    name: str
    num_params: float
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    max_model_len: int
    aliases: tuple[str, ...] = ()
    weight_bytes_per_param: int = 2  # fp16 / bf16 weights
    intermediate_size: int = field(kw_only=True)  # the gated MLP's (SwiGLU: gate and up, then down)
    vocab_size: int = field(kw_only=True)

    @property
    def weight_bytes(self) -> int:
        return int(self.num_params * self.weight_bytes_per_param)

    @property
    def kv_elements_per_token(self) -> int:
        """K and V, all layers, all KV heads."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, kv_dtype: str = "fp16") -> float:
        dt = get_kv_dtype(kv_dtype)
        per_head = self.head_dim * dt.bits / 8 + dt.scale_bytes_per_head
        return 2 * self.num_layers * self.num_kv_heads * per_head

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query token, context token) pair, all layers: QK^T and PV, 2 each."""
        return 4 * self.num_heads * self.head_dim * self.num_layers


MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    ModelSpec("llama-2-7b", 6.74e9, 32, 32, 32, 128, 4096, 4096, ("meta-llama/llama-2-7b-hf",),
              intermediate_size=11008, vocab_size=32000),
    ModelSpec("llama-2-13b", 13.02e9, 40, 40, 40, 128, 5120, 4096, ("meta-llama/llama-2-13b-hf",),
              intermediate_size=13824, vocab_size=32000),
    ModelSpec("llama-2-70b", 68.98e9, 80, 64, 8, 128, 8192, 4096, ("meta-llama/llama-2-70b-hf",),
              intermediate_size=28672, vocab_size=32000),
    ModelSpec("llama-3-70b", 70.55e9, 80, 64, 8, 128, 8192, 8192, ("meta-llama/meta-llama-3-70b",),
              intermediate_size=28672, vocab_size=128256),
    ModelSpec("llama-3-8b", 8.03e9, 32, 32, 8, 128, 4096, 8192, ("meta-llama/meta-llama-3-8b",),
              intermediate_size=14336, vocab_size=128256),
    ModelSpec("llama-3.1-8b", 8.03e9, 32, 32, 8, 128, 4096, 131072, ("meta-llama/llama-3.1-8b",),
              intermediate_size=14336, vocab_size=128256),
    ModelSpec("qwen2-7b", 7.62e9, 28, 28, 4, 128, 3584, 32768, ("qwen/qwen2-7b",),
              intermediate_size=18944, vocab_size=152064),
    # The three other Llama-family models Vidur profiles, as its model configs give their shapes (so that
    # a tree of Vidur's profiles calibrates and predicts them too). Vidur keeps InternLM2-20B's profiles in
    # a folder named internlm/internlm-20b. Qwen-72B's config.json says intermediate_size 49152: Qwen's
    # code halves it for each of the MLP's two input projections.
    ModelSpec("codellama-34b", 33.74e9, 48, 64, 8, 128, 8192, 16384,
              ("codellama/codellama-34b-hf", "codellama/codellama-34b-instruct-hf"),
              intermediate_size=22016, vocab_size=32000),
    ModelSpec("internlm2-20b", 19.86e9, 48, 48, 8, 128, 6144, 32768,
              ("internlm/internlm2-20b", "internlm/internlm-20b"),
              intermediate_size=16384, vocab_size=92544),
    ModelSpec("qwen-72b", 72.29e9, 80, 64, 64, 128, 8192, 32768, ("qwen/qwen-72b",),
              intermediate_size=24576, vocab_size=152064),
    ModelSpec("smollm2-135m", 134.5e6, 30, 9, 3, 64, 576, 8192,
              ("huggingfacetb/smollm2-135m", "huggingfacetb/smollm2-135m-instruct", "smollm2-135m-instruct"),
              intermediate_size=1536, vocab_size=49152),
)}
_ALIASES = {a: m.name for m in MODELS.values() for a in m.aliases}


def get_model(name: str | ModelSpec) -> ModelSpec:
    """A catalog model by name or Hugging Face id, or a Hugging Face config.json (or its folder)."""
    if isinstance(name, str) and name.lower() not in MODELS and is_config_path(name):
        return read_hf_config(name)
    return lookup("model", name, MODELS, _ALIASES)


@dataclass(slots=True, frozen=True)
class KVDtype:
    """How the KV cache stores a value, and what reading it back costs.

    The formats the engine and kernels implement (`kernels.quant`): int8 keeps one float32 scale
    per (token, head); int4 one float32 scale per group of 32 values, i.e. 4 + 32/32 = 5 bits a
    value (exact for any head_dim divisible by 32); fp8 (e4m3) a per-tensor scale, i.e. nothing
    per token.
    `dequant_ops` counts FP32 operations per element read: convert (+ unpack for int4),
    multiply by the scale (+ add the zero point for int4).
    """

    name: str
    bits: int
    scale_bytes_per_head: int
    dequant_ops: int


KV_DTYPES: dict[str, KVDtype] = {d.name: d for d in (
    KVDtype("fp16", 16, 0, 0),
    KVDtype("fp8", 8, 0, 1),
    KVDtype("int8", 8, 4, 2),
    KVDtype("int4", 5, 0, 4),  # 4 bits + its group's float32 scale, 32 bits over 32 values
)}


def get_kv_dtype(name: str) -> KVDtype:
    return lookup("KV cache dtype", name, KV_DTYPES)
