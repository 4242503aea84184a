"""Bad input is a ValueError naming the argument, raised before any kernel runs.

The message leads with the argument it blames; where two arguments disagree (a key on one
device, its cache on another) it names both, and either may lead.
"""

import math

import pytest
import torch

import kernels

BACKENDS = ("triton", "torch")


def attention_args() -> dict:
    """A valid call (the engine contract's example), to spoil one argument at a time."""
    return {
        "query": torch.randn(3, 4, 16),
        "key_cache": torch.randn(4, 8, 2, 16),
        "value_cache": torch.randn(4, 8, 2, 16),
        "block_table": torch.tensor([[2, 0], [1, 3]], dtype=torch.int32),
        "seq_lens": torch.tensor([10, 5], dtype=torch.int32),
        "query_start_loc": torch.tensor([0, 1, 3], dtype=torch.int32),
        "scale": 0.25,
    }


def int8_cache() -> dict:
    return {
        "key_cache": torch.zeros(4, 8, 2, 16, dtype=torch.int8),
        "value_cache": torch.zeros(4, 8, 2, 16, dtype=torch.int8),
        "k_scale": torch.ones(4, 8, 2),
        "v_scale": torch.ones(4, 8, 2),
    }


META = torch.device("meta")  # a second device on any machine
BAD_ATTENTION = {
    "query is not a tensor": ("query", [[0.0]]),
    "query is float64": ("query", torch.randn(3, 4, 16, dtype=torch.float64)),
    "query is an integer tensor": ("query", torch.zeros(3, 4, 16, dtype=torch.int32)),
    "query is 2-D": ("query", torch.randn(3, 64)),
    "heads not a multiple of KV heads": ("query", torch.randn(3, 3, 16)),
    "key_cache is 3-D": ("key_cache", torch.randn(4, 8, 32)),
    "key_cache is float64": ("key_cache", torch.randn(4, 8, 2, 16, dtype=torch.float64)),
    "key_cache head_dim differs": ("key_cache", torch.randn(4, 8, 2, 32)),
    "key_cache not contiguous": ("key_cache", torch.randn(4, 8, 2, 32)[..., :16]),
    "value_cache shape differs": ("value_cache", torch.randn(5, 8, 2, 16)),
    "value_cache dtype differs": ("value_cache", torch.randn(4, 8, 2, 16, dtype=torch.bfloat16)),
    "value_cache on another device": ("value_cache", torch.randn(4, 8, 2, 16, device=META)),
    "block_table is int64": ("block_table", torch.tensor([[2, 0], [1, 3]])),
    "block_table points past the cache": ("block_table", torch.tensor([[2, 4], [1, 3]], dtype=torch.int32)),
    "block_table has a negative id": ("block_table", torch.tensor([[2, 0], [-1, 3]], dtype=torch.int32)),
    "block_table on another device": ("block_table", torch.zeros(2, 2, dtype=torch.int32, device=META)),
    "seq_lens shorter than the queries": ("seq_lens", torch.tensor([10, 1], dtype=torch.int32)),
    "seq_lens beyond the table": ("seq_lens", torch.tensor([17, 5], dtype=torch.int32)),
    "seq_lens of the wrong length": ("seq_lens", torch.tensor([10, 5, 5], dtype=torch.int32)),
    "seq_lens is float": ("seq_lens", torch.tensor([10.0, 5.0])),
    "query_start_loc does not end at num_tokens": ("query_start_loc", torch.tensor([0, 1, 2], dtype=torch.int32)),
    "query_start_loc does not start at 0": ("query_start_loc", torch.tensor([1, 2, 3], dtype=torch.int32)),
    "query_start_loc decreases": ("query_start_loc", torch.tensor([0, 4, 3], dtype=torch.int32)),
    "query_start_loc of the wrong length": ("query_start_loc", torch.tensor([0, 3], dtype=torch.int32)),
    "scale is None": ("scale", None),
    "scale is NaN": ("scale", math.nan),
    "scale is infinite": ("scale", math.inf),
    "scale is a string": ("scale", "0.25"),
    "out has the wrong shape": ("out", torch.empty(3, 4, 8)),
    "out has the wrong dtype": ("out", torch.empty(3, 4, 16, dtype=torch.float16)),
    "out is not contiguous": ("out", torch.empty(3, 4, 32)[..., :16]),
    "scales for a float cache": ("k_scale", torch.ones(4, 8, 2)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(BAD_ATTENTION))
def test_paged_attention_rejects(case, backend):
    name, bad = BAD_ATTENTION[case]
    args = attention_args()
    args[name] = bad
    with pytest.raises(ValueError, match=f"^{name}:"):
        kernels.paged_attention(**args, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float32_cache_is_refused_under_bfloat16_queries(backend):
    """Reading it would round every key and value: only caches the query's dtype holds exactly are read."""
    args = {**attention_args(), "query": torch.randn(3, 4, 16, dtype=torch.bfloat16)}
    with pytest.raises(ValueError, match="^key_cache: a torch.float32 cache cannot be read exactly"):
        kernels.paged_attention(**args, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_attention_rejects_empty_head_dims(backend):
    args = {**attention_args(), "query": torch.randn(3, 4, 0), "key_cache": torch.randn(4, 8, 2, 0),
            "value_cache": torch.randn(4, 8, 2, 0)}
    with pytest.raises(ValueError, match="^key_cache: block_size, num_kv_heads and head_dim must be >= 1"):
        kernels.paged_attention(**args, backend=backend)


BAD_INT8_ATTENTION = {
    "int8 cache without scales": ("k_scale", None),
    "scale of the wrong shape": ("v_scale", torch.ones(4, 8, 1)),
    "scale of the wrong dtype": ("k_scale", torch.ones(4, 8, 2, dtype=torch.float16)),
}


@pytest.mark.parametrize("case", list(BAD_INT8_ATTENTION))
def test_paged_attention_rejects_bad_scales(case):
    name, bad = BAD_INT8_ATTENTION[case]
    args = {**attention_args(), **int8_cache(), name: bad}
    with pytest.raises(ValueError, match=f"^{name}:"):
        kernels.paged_attention(**args)


def fp8_cache(scale_shape=(1,)) -> dict:
    return {
        "key_cache": torch.zeros(4, 8, 2, 16, dtype=torch.float8_e4m3fn),
        "value_cache": torch.zeros(4, 8, 2, 16, dtype=torch.float8_e4m3fn),
        "k_scale": torch.ones(scale_shape),
        "v_scale": torch.ones(scale_shape),
    }


def int4_cache(num_groups=2) -> dict:
    return {
        "key_cache": torch.zeros(4, 8, 2, 8, dtype=torch.uint8),
        "value_cache": torch.zeros(4, 8, 2, 8, dtype=torch.uint8),
        "k_scale": torch.ones(4, 8, 2, num_groups),
        "v_scale": torch.ones(4, 8, 2, num_groups),
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cache", [fp8_cache(), fp8_cache((2,)), int4_cache(), int4_cache(8)], ids=str)
def test_paged_attention_takes_fp8_and_int4_caches(cache, backend):
    out = kernels.paged_attention(**{**attention_args(), **cache}, backend=backend)
    assert out.shape == (3, 4, 16) and torch.isfinite(out).all()


BAD_QUANTIZED_ATTENTION = {
    "fp8 without scales": (fp8_cache(), "k_scale", None),
    "fp8 scale per token": (fp8_cache(), "k_scale", torch.ones(4, 8, 2)),
    "fp8 scale for 3 heads of 2": (fp8_cache(), "v_scale", torch.ones(3)),
    "fp8 scale of zero": (fp8_cache(), "k_scale", torch.zeros(1)),
    "fp8 scale NaN": (fp8_cache(), "v_scale", torch.full((1,), math.nan)),
    "fp8 scales of two shapes": (fp8_cache(), "v_scale", torch.ones(2)),
    "int4 scales of 3 groups in 16 channels": (int4_cache(), "k_scale", torch.ones(4, 8, 2, 3)),
    "int4 scales of group size 1": (int4_cache(), "k_scale", torch.ones(4, 8, 2, 16)),
    "int4 scales per head only": (int4_cache(), "v_scale", torch.ones(4, 8, 2)),
    "int4 cache not packed (16 bytes for head_dim 16)": (int4_cache(), "key_cache", torch.zeros(4, 8, 2, 16,
                                                                                                dtype=torch.uint8)),
}


@pytest.mark.parametrize("case", list(BAD_QUANTIZED_ATTENTION))
def test_paged_attention_rejects_bad_quantized_caches(case):
    cache, name, bad = BAD_QUANTIZED_ATTENTION[case]
    args = {**attention_args(), **cache, name: bad}
    if name == "key_cache":
        args["value_cache"] = bad
    with pytest.raises(ValueError, match=f"^{name}:"):
        kernels.paged_attention(**args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_int4_write_refuses_an_odd_head_dim(backend):
    """int4 packs two channels a byte: a head_dim of 15 cannot be stored, whatever the cache's shape."""
    args = {**write_args(), "key": torch.randn(3, 2, 15), "value": torch.randn(3, 2, 15),
            **int4_cache(num_groups=1)}
    args["key_cache"] = args["value_cache"] = torch.zeros(4, 8, 2, 7, dtype=torch.uint8)
    with pytest.raises(ValueError, match="^key: head_dim 15 is odd, but an int4 cache packs two values a byte"):
        kernels.reshape_and_cache(**args, backend=backend)


def test_rejects_unknown_backend():
    with pytest.raises(ValueError, match="^backend:"):
        kernels.paged_attention(**attention_args(), backend="cuda")


def write_args() -> dict:
    return {
        "key": torch.randn(3, 2, 16),
        "value": torch.randn(3, 2, 16),
        "key_cache": torch.zeros(4, 8, 2, 16),
        "value_cache": torch.zeros(4, 8, 2, 16),
        "slot_mapping": torch.tensor([5, -1, 31]),
    }


BAD_WRITE = {
    "key float16 into a float32 cache": ("key", torch.randn(3, 2, 16, dtype=torch.float16)),
    "key heads differ from the cache": ("key", torch.randn(3, 1, 16)),
    "key on another device": ("key", torch.randn(3, 2, 16, device=META)),
    "value shape differs": ("value", torch.randn(2, 2, 16)),
    "value_cache not contiguous": ("value_cache", torch.zeros(4, 8, 2, 32)[..., :16]),
    "slot_mapping is float": ("slot_mapping", torch.tensor([5.0, -1.0, 31.0])),
    "slot_mapping past the cache": ("slot_mapping", torch.tensor([5, -1, 32])),
    "slot_mapping below -1": ("slot_mapping", torch.tensor([5, -2, 31])),
    "slot_mapping writes a slot twice": ("slot_mapping", torch.tensor([5, 5, 31])),
    "slot_mapping of the wrong length": ("slot_mapping", torch.tensor([5, -1])),
    "slot_mapping on another device": ("slot_mapping", torch.zeros(3, dtype=torch.long, device=META)),
    "scales for a float cache": ("v_scale", torch.ones(4, 8, 2)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(BAD_WRITE))
def test_reshape_and_cache_rejects(case, backend):
    name, bad = BAD_WRITE[case]
    args = write_args()
    args[name] = bad
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        kernels.reshape_and_cache(**args, backend=backend)


BAD_COPY = {
    "not pairs": torch.tensor([[0, 1, 2]]),
    "a block past the cache": torch.tensor([[0, 4]]),
    "a negative block": torch.tensor([[-1, 2]]),
    "a destination twice": torch.tensor([[0, 2], [1, 2]]),
    "a destination that is also a source": torch.tensor([[0, 1], [1, 2]]),
    "float ids": torch.tensor([[0.0, 1.0]]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(BAD_COPY))
def test_copy_blocks_rejects(case, backend):
    key_cache, value_cache = torch.zeros(4, 8, 2, 16), torch.zeros(4, 8, 2, 16)
    with pytest.raises(ValueError, match="^block_mapping:"):
        kernels.copy_blocks(key_cache, value_cache, BAD_COPY[case], backend=backend)
