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
