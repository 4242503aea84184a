"""The shape of a Llama-family decoder, whatever file it came from.

Hugging Face `config.json` files and GGUF metadata spell the same facts differently (and
transformers 4 and 5 spell RoPE differently); both loaders reduce them to this one record, so
the model code and the KV-cache sizing read a single vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass

from paged.core.validation import is_int

# Hugging Face architecture names the Llama forward serves; Qwen2 differs only by a bias on q, k, v.
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


@dataclass(slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "llama3", ...}; None for plain RoPE
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    sliding_window: int | None = None  # only when the model really uses one (Mistral v0.1)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture {self.architecture!r} is not supported: expected one of {ARCHITECTURES}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings"):
            v = getattr(self, name)
            if not is_int(v) or v < 1:
                raise ValueError(f"model config: {name}={v!r}: expected an integer >= 1")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")

    @property
    def max_model_len(self) -> int:
        """The longest sequence served exactly: a sliding window is not implemented, so a model
        that uses one is served up to its window only (where full attention is the same thing)."""
        if self.sliding_window is None:
            return self.max_position_embeddings
        return min(self.max_position_embeddings, self.sliding_window)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_hf(cls, cfg: dict) -> ModelConfig:
        """From a Hugging Face `config.json` (transformers 4 `rope_theta`/`rope_scaling` or 5 `rope_parameters`)."""
        if not isinstance(cfg, dict):
            raise ValueError(f"config.json: expected a JSON object, got {type(cfg).__name__}")
        archs = cfg.get("architectures") or [_MODEL_TYPES.get(cfg.get("model_type"), str(cfg.get("model_type")))]
        arch = archs[0] if isinstance(archs, list) and archs else repr(archs)
        if arch not in ARCHITECTURES:
            raise ValueError(f"config.json: architecture {arch!r} is not supported: expected one of {ARCHITECTURES}")
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in cfg]
        if missing:
            raise ValueError(f"config.json: missing field(s) {missing} that a {arch} needs")
        if not is_int(cfg["num_attention_heads"]) or cfg["num_attention_heads"] < 1:
            raise ValueError(f"config.json: num_attention_heads={cfg['num_attention_heads']!r}: expected an integer "
                             ">= 1")
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        qwen2 = arch == "Qwen2ForCausalLM"
        window = cfg.get("sliding_window") if (not qwen2 or cfg.get("use_sliding_window")) else None
        eos = cfg.get("eos_token_id")
        heads = cfg["num_attention_heads"]
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or (cfg["hidden_size"] // heads if isinstance(cfg["hidden_size"], int)
                                             else None),  # a bad hidden_size is named by __post_init__
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=None if rope_type == "default" else {**rope, "rope_type": rope_type},
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            qkv_bias=qwen2 or cfg.get("attention_bias", False),
            o_bias=cfg.get("attention_bias", False),
            sliding_window=window,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
        )
