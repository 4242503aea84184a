"""The vectorised torch path (the engine's backend without a GPU) against the oracle."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kernels
from tests.kernels.layouts import DEVICES, DTYPES, paged_batches


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_matches_oracle(device, dtype, data):
    batch = data.draw(paged_batches(device, dtype))
    batch.assert_matches_oracle(kernels.paged_attention(*batch.args(), backend="torch"))


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_quantized_cache_matches_oracle(device, data):
    batch = data.draw(paged_batches(device, quantized=True))
    batch.assert_matches_oracle(kernels.paged_attention(*batch.args(), **batch.scales(), backend="torch"))
