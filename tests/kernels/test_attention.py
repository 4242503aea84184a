"""The Triton paged-attention kernel against the oracle (on the CPU through Triton's interpreter)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kernels
from kernels import attention
from tests.kernels.layouts import DEVICES, DTYPES, QUANTIZED_FORMATS, paged_batches


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_matches_oracle(device, dtype, data):
    batch = data.draw(paged_batches(device, dtype))
    batch.assert_matches_oracle(kernels.paged_attention(*batch.args(), backend="triton"))


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data(), num_splits=st.integers(2, 5))
def test_split_kv_matches_oracle(device, data, num_splits):
    """Forced splits, including more splits than key tiles (empty splits must weigh nothing)."""
    batch = data.draw(paged_batches(device))
    out = torch.empty_like(batch.query)
    attention.paged_attention(*batch.args(), out, num_splits=num_splits)
    batch.assert_matches_oracle(out)


@pytest.mark.parametrize("kv_format", QUANTIZED_FORMATS)
@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_quantized_cache_matches_oracle(device, kv_format, data):
    """Kernel and oracle read the same quantized cache, so the gap is the float tolerance alone."""
    batch = data.draw(paged_batches(device, kv_format=kv_format))
    batch.assert_matches_oracle(kernels.paged_attention(*batch.args(), **batch.scales(), backend="triton"))


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_float16_cache_under_float32_queries_matches_oracle(device, data):
    batch = data.draw(paged_batches(device, torch.float32, kv_format="float16", max_seqs=2))
    batch.assert_matches_oracle(kernels.paged_attention(*batch.args(), backend="triton"))


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_writes_into_out(device, data):
    batch = data.draw(paged_batches(device, max_seqs=2))
    out = torch.zeros_like(batch.query)
    assert kernels.paged_attention(*batch.args(), out=out, backend="triton") is out
    batch.assert_matches_oracle(out)
