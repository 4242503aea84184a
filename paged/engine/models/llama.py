"""The Llama-family decoder (Llama, Mistral, SmolLM2, Qwen2 with its q/k/v bias) on the paged cache.

Hugging Face's layer order and arithmetic (RMSNorm in float32, neox RoPE, SiLU-gated MLP),
with q/k/v and gate/up each fused into one matmul as vLLM does: one weight read instead of
three (two), which is most of a CPU decode step. `load_weights` takes Hugging Face names, so
every loader (safetensors, GGUF) only has to speak that one naming.

The forward takes a flat batch of tokens from many sequences; nothing in it knows about
sequences except attention, which reads `AttentionMetadata`. Logits are computed only for the
rows that sample (`compute_logits`), not for every prompt token.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from ..attention_layer import AttentionMetadata, PagedAttention
from .model_config import ModelConfig
from .rotary import RotaryEmbedding, apply_rotary


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        self.attn = PagedAttention(self.head_dim ** -0.5)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata):
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rotary(q.view(n, self.num_heads, self.head_dim), *rope)
        k = apply_rotary(k.view(n, self.num_kv_heads, self.head_dim), *rope)
        out = self.attn(q, k, v.view(n, self.num_kv_heads, self.head_dim), meta)
        return self.o_proj(out.view(n, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x: torch.Tensor, rope, meta: AttentionMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


# Hugging Face weight name -> (our fused parameter, shard index): the order of the shards in it.
_FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)

    @property
    def attention_layers(self) -> list[PagedAttention]:
        """One per decoder layer, in order: the runner binds one KV cache pair to each."""
        return [layer.self_attn.attn for layer in self.layers]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states [num_tokens, hidden_size] of a flat batch; K/V of every token land in the cache."""
        x = self.embed_tokens(input_ids)
        rope = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, rope, meta)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden)).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face-named tensors in; every parameter must be covered exactly once."""
        params = dict(self.named_parameters())
        todo = {p: 3 if ".qkv_proj." in p else 2 if ".gate_up_proj." in p else 1 for p in params}  # shards
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and self.config.tie_word_embeddings):
                continue  # recomputed, or the same tensor as the embedding
            parts = name.split(".")
            fused = _FUSED.get(parts[-2]) if len(parts) >= 2 else None
            if fused is not None:
                parts[-2] = fused[0]
            pname = ".".join(parts)
            param = params.get(pname)
            if param is None:
                raise ValueError(f"checkpoint tensor {hf_name!r} has no place in {self.config.architecture}")
            target = param.data
            if fused is not None:
                sizes = self._shard_sizes(fused[0])
                start = sum(sizes[:fused[1]])
                target = target[start:start + sizes[fused[1]]]
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(f"checkpoint tensor {hf_name!r} has shape {tuple(tensor.shape)}, "
                                 f"expected {tuple(target.shape)}")
            target.copy_(tensor)
            todo[pname] -= 1
        wrong = sorted(p for p, left in todo.items() if left)
        if wrong:
            raise ValueError(f"checkpoint lacks (or repeats) weights of {len(wrong)} parameters, e.g. {wrong[:3]}")

    def _shard_sizes(self, fused: str) -> list[int]:
        cfg = self.config
        if fused == "qkv_proj":
            kv = cfg.num_key_value_heads * cfg.head_dim
            return [cfg.num_attention_heads * cfg.head_dim, kv, kv]
        return [cfg.intermediate_size, cfg.intermediate_size]
