"""GGUF reading: llama.cpp's q/k row order is undone exactly; bad files are clear errors."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from paged.engine.gguf_file import GGUFFile, unpermute_rows


def llama_cpp_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to q/k weights (its `LlamaModel.permute`)."""
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@given(heads=st.integers(1, 4), half_dim=st.integers(1, 4), cols=st.integers(1, 3), bias=st.booleans())
def test_unpermute_inverts_llama_cpp(heads, half_dim, cols, bias):
    shape = (heads * 2 * half_dim,) if bias else (heads * 2 * half_dim, cols)
    w = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    assert np.array_equal(unpermute_rows(llama_cpp_permute(w, heads), heads), w)


def test_truncated_gguf_is_a_clear_error(tmp_path):
    from paged.engine.loader import resolve_model_path

    head = resolve_model_path("smollm2-135m").read_bytes()[:4096]
    path = tmp_path / "cut.gguf"
    path.write_bytes(head)
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        GGUFFile(path)


HF_TO_GGUF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def write_llama_gguf(hf, path) -> None:
    """A Hugging Face Llama written the way llama.cpp's converter writes it (q/k rows permuted)."""
    import gguf

    c = hf.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_vocab_size(c.vocab_size)
    for name, t in hf.state_dict().items():
        a = t.float().numpy().copy()
        if name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            gname = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"}[name]
        else:
            parts = name.split(".")  # model.layers.<i>.<module>.<kind>
            module = ".".join(parts[3:-1])
            gname = f"blk.{parts[2]}.{HF_TO_GGUF[module]}.{parts[-1]}"
            if module in ("self_attn.q_proj", "self_attn.k_proj"):
                heads = c.num_attention_heads if module.endswith("q_proj") else c.num_key_value_heads
                a = llama_cpp_permute(a, heads)
        w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("attention_bias", [False, True])
def test_gguf_llama_with_and_without_attention_biases_matches_transformers(tmp_path, attention_bias):
    from paged.engine import LLM, SamplingParams

    from .tiny_models import hf_greedy, make_tiny_model

    folder, hf = make_tiny_model(tmp_path / "hf", "llama", seed=1, attention_bias=attention_bias)
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(hf, path)
    llm = LLM(str(path), tokenizer=str(folder), kv_cache_memory_bytes=4 << 20, max_num_batched_tokens=256,
              max_model_len=512)
    prompt = [104, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100]
    got = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0].token_ids
    assert got == hf_greedy(hf, prompt, 10, eos=None)
