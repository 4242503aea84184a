"""Reading a GGUF file (llama.cpp's format) into the engine's vocabulary.

Three translations: metadata keys -> `ModelConfig`; tensor names -> Hugging Face names, with
quantized blocks (Q4_1, Q8_0, ...) dequantized to float by the `gguf` package; and, for the
Llama architecture, q/k rows put back in Hugging Face order. llama.cpp's converter interleaves
the two halves of each head's q and k rows because its RoPE rotates adjacent pairs (GPT-J
style); undoing it lets one neox-style RoPE serve checkpoints from both sources.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from .models.model_config import ModelConfig

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def _reader(path: Path):
    """`gguf.GGUFReader` over a plain ndarray view of its memory map (the same bytes, still mapped, not read).
    The reader slices its data once per field and per string, ~250k times for SmolLM2's vocabulary and merges,
    and a slice of an `np.memmap` runs memmap's Python-level `__array_finalize__`: parsing took 2.7 s of CPU
    over the memmap, 0.8 s over the view, the same fields and tensors. Every engine, server and test that loads
    a GGUF model pays it."""
    from gguf import GGUFReader  # imported here: only GGUF users pay for it

    class Reader(GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._data

        @data.setter
        def data(self, value: np.memmap) -> None:  # GGUFReader.__init__ sets it before it parses
            self._data = value.view(np.ndarray)

    return Reader(path)


class GGUFFile:
    def __init__(self, path: Path) -> None:
        try:
            self.reader = _reader(path)
            self.fields = {key: field.contents() for key, field in self.reader.fields.items()}
        except Exception as e:  # the reader raises whatever numpy and struct raise on a bad file
            raise ValueError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from e
        self.path = path

    def model_config(self) -> ModelConfig:
        f = self.fields
        arch = f.get("general.architecture")
        if arch not in _ARCHITECTURES:
            raise ValueError(f"{self.path}: GGUF architecture {arch!r} is not supported: expected one of "
                             f"{sorted(_ARCHITECTURES)}")
        names = {t.name for t in self.reader.tensors}
        if "rope_freqs.weight" in names:
            raise ValueError(f"{self.path}: per-dimension RoPE frequency factors (rope_freqs) are not supported")
        heads = f[f"{arch}.attention.head_count"]
        hidden = f[f"{arch}.embedding_length"]
        scaling = None
        scaling_type = f.get(f"{arch}.rope.scaling.type", "none")
        if scaling_type == "linear":
            scaling = {"rope_type": "linear", "factor": f[f"{arch}.rope.scaling.factor"]}
        elif scaling_type != "none":
            raise ValueError(f"{self.path}: RoPE scaling {scaling_type!r} is not supported: expected none or linear")
        eos = f.get("tokenizer.ggml.eos_token_id")
        return ModelConfig(
            architecture=_ARCHITECTURES[arch],
            vocab_size=f.get(f"{arch}.vocab_size") or len(f["tokenizer.ggml.tokens"]),
            hidden_size=hidden,
            intermediate_size=f[f"{arch}.feed_forward_length"],
            num_hidden_layers=f[f"{arch}.block_count"],
            num_attention_heads=heads,
            num_key_value_heads=f.get(f"{arch}.attention.head_count_kv", heads),
            head_dim=f.get(f"{arch}.attention.key_length", hidden // heads),
            rms_norm_eps=f.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
            rope_theta=f.get(f"{arch}.rope.freq_base", 10000.0),
            rope_scaling=scaling,
            max_position_embeddings=f.get(f"{arch}.context_length", 4096),
            tie_word_embeddings="output.weight" not in names,
            qkv_bias="blk.0.attn_q.bias" in names,
            o_bias="blk.0.attn_output.bias" in names,
            bos_token_id=f.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=() if eos is None else (eos,),
        )

    def weights(self, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
        """(Hugging Face name, float32 tensor) for every tensor of the file."""
        from gguf import dequantize

        unpermute = self.fields["general.architecture"] == "llama"
        for tensor in self.reader.tensors:
            name = _hf_name(tensor.name)
            if name is None:
                raise ValueError(f"{self.path}: unexpected tensor {tensor.name!r}")
            # A copy: float tensors come back as views of the read-only memory map.
            w = np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
            # llama.cpp's converter permutes q and k rows, weights and biases alike
            if unpermute and name.endswith(("q_proj.weight", "q_proj.bias")):
                w = unpermute_rows(w, config.num_attention_heads)
            elif unpermute and name.endswith(("k_proj.weight", "k_proj.bias")):
                w = unpermute_rows(w, config.num_key_value_heads)
            yield name, torch.from_numpy(np.ascontiguousarray(w))


def _hf_name(name: str) -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _LAYER_TENSOR.fullmatch(name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        return None
    return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"


def unpermute_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Hugging Face's q/k row order from llama.cpp's, where each head's two halves are interleaved."""
    return w.reshape(num_heads, w.shape[0] // num_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
