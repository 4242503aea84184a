"""A ModelSpec from a Hugging Face `config.json` of a Llama-family model, so that `--model` takes
any such model, not only the catalog's.

Llama-family: decoder-only, RMSNorm, rotary, a gated (SwiGLU) MLP, optional grouped-query
attention: Llama 1-3, CodeLlama, Mistral, Qwen (1) and Qwen2 (their QKV biases are too small to
count), InternLM and InternLM2. Qwen (1)'s config.json gives twice the width of each of the MLP's
two input projections (its code halves `intermediate_size`), and the head size as `kv_channels`.
Parameters are counted from the shapes (the embedding counted once when tied to the LM head);
mixture-of-experts variants are refused rather than mis-timed. A sliding window (Mistral v0.1) is
not read: attention is timed as full attention over the whole context.
"""
from __future__ import annotations

import json
from pathlib import Path

LLAMA_FAMILY = ("llama", "mistral", "qwen", "qwen2", "internlm", "internlm2", "codellama")
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


def is_config_path(name: str) -> bool:
    p = Path(name)
    return p.suffix == ".json" or (p / "config.json").is_file()


def read_hf_config(path: str | Path):
    """The ModelSpec of the config.json at `path` (or in the folder `path`)."""
    from .models import ModelSpec

    p = Path(path)
    p = p / "config.json" if p.is_dir() else p
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise FileNotFoundError(f"model config {str(p)!r}: cannot read it: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"model config {str(p)!r}: not valid JSON ({e})") from None
    kind = cfg.get("model_type")
    if kind not in LLAMA_FAMILY:
        raise ValueError(f"model config {str(p)!r}: model_type={kind!r}: expected a Llama-family model, one of "
                         f"{list(LLAMA_FAMILY)}")
    if cfg.get("num_local_experts") or cfg.get("num_experts"):
        raise ValueError(f"model config {str(p)!r}: a mixture of experts: expected a dense model")
    bad = [k for k in REQUIRED if not isinstance(cfg.get(k), int) or isinstance(cfg.get(k), bool) or cfg[k] < 1]
    if bad:
        raise ValueError(f"model config {str(p)!r}: {', '.join(f'{k}={cfg.get(k)!r}' for k in bad)}: expected "
                         "integers >= 1")
    h, layers, heads = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg.get("kv_channels") or h // heads
    ffn, vocab = cfg["intermediate_size"], cfg["vocab_size"]
    if kind == "qwen":
        ffn //= 2
    per_layer = h * (heads + 2 * kv_heads) * head_dim + heads * head_dim * h + 3 * h * ffn + 2 * h
    params = layers * per_layer + vocab * h * (1 if cfg.get("tie_word_embeddings") else 2) + h
    name = cfg.get("_name_or_path") or p.parent.name
    return ModelSpec(str(name).lower(), float(params), layers, heads, kv_heads, head_dim, h,
                     int(cfg.get("max_position_embeddings") or 4096), intermediate_size=ffn, vocab_size=vocab)
