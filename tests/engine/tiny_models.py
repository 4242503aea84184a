"""Tiny random Llama-family checkpoints written the way Hugging Face writes them, and their greedy reference.

The tokenizer is byte-level with no merges: any text encodes (one token per byte), which is all
the stop-string and streaming tests need. Weights are drawn with a large std so logits are far
apart: greedy choices are then robust to the last-bit differences between the paged kernels and
transformers' attention, and a mismatch means a real bug.
"""
from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

BOS, EOS = 256, 257
VOCAB = 320  # 256 bytes, BOS, EOS, and unused ids (as real vocabularies have)
ARCHES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {"tie_word_embeddings": True}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
}


def byte_tokenizer() -> Tokenizer:
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<s>"], vocab["</s>"] = BOS, EOS
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>"])
    return tok


def make_tiny_model(folder: Path, arch: str = "llama", seed: int = 0, **overrides) -> tuple[Path, torch.nn.Module]:
    """Save a tiny random model (config.json, safetensors, tokenizer.json) into `folder`; return it and the HF model."""
    config_cls, model_cls, arch_defaults = ARCHES[arch]
    config = config_cls(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                        bos_token_id=BOS, eos_token_id=EOS, **{**arch_defaults, **overrides})
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.25)
            elif not torch.all(p == 1):  # biases; norm weights stay 1
                p.normal_(0.0, 0.25)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    byte_tokenizer().save(str(folder / "tokenizer.json"))
    return folder, model


@torch.no_grad()
def hf_greedy(model: torch.nn.Module, prompt: list[int], max_tokens: int, eos: int | None = EOS) -> list[int]:
    """transformers' generate(), greedy, one prompt (no padding), stopping at EOS like the engine."""
    ids = torch.tensor([prompt])
    # An explicit mask: without one, generate() masks every prompt token equal to pad_token_id.
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                         eos_token_id=eos, pad_token_id=EOS)
    return out[0, len(prompt):].tolist()
