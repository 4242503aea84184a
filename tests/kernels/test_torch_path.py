"""The vectorised torch path (the engine's backend without a GPU) against the oracle."""

from unittest import mock

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kernels
from kernels import torch_path
from tests.kernels.layouts import DEVICES, DTYPES, QUANTIZED_FORMATS, paged_batches


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_matches_oracle(device, dtype, data):
    batch = data.draw(paged_batches(device, dtype))
    batch.assert_matches_oracle(kernels.paged_attention(*batch.args(), backend="torch"))


@pytest.mark.parametrize("kv_format", QUANTIZED_FORMATS)
@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_quantized_cache_matches_oracle(device, kv_format, data):
    batch = data.draw(paged_batches(device, kv_format=kv_format))
    batch.assert_matches_oracle(kernels.paged_attention(*batch.args(), **batch.scales(), backend="torch"))


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_decodes_in_several_groups_match_oracle(device, data):
    """The drawn batches are short, so the default bounds keep their decodes in one group: tighter bounds
    split them into several groups, ragged or not, in any order against the batch's."""
    kv_format = data.draw(st.sampled_from((None, "float16", *QUANTIZED_FORMATS)))
    dtype = torch.float32 if kv_format == "float16" else None
    batch = data.draw(paged_batches(device, dtype, kv_format=kv_format, max_seqs=8))
    bounds = {"PAD_SLACK": data.draw(st.integers(0, 20)), "PAD_FRACTION": data.draw(st.sampled_from([0.0, 0.25])),
              "GROUP_BYTES": data.draw(st.sampled_from([1, 1 << 12, 1 << 20]))}
    with mock.patch.multiple(torch_path, **bounds):
        out = kernels.paged_attention(*batch.args(), **batch.scales(), backend="torch")
    batch.assert_matches_oracle(out)


@given(lens=st.lists(st.integers(1, 5000), max_size=40), slack=st.integers(0, 200),
       fraction=st.sampled_from([0.0, 0.25, 0.5]), max_positions=st.integers(1, 20000))
def test_decode_groups_bound_the_padding_and_the_size(lens, slack, fraction, max_positions):
    """Groups cover the sorted contexts in order; within one, no context is padded by more than the bound,
    and a group of several stays within max_positions; a group ends only where the next context would have
    broken a bound."""
    lens = sorted(lens, reverse=True)
    with mock.patch.multiple(torch_path, PAD_SLACK=slack, PAD_FRACTION=fraction):
        groups = torch_path.decode_groups(lens, max_positions)
    assert [i for first, last in groups for i in range(first, last)] == list(range(len(lens)))
    for first, last in groups:
        bound = max(slack, fraction * lens[first])
        assert lens[first] - lens[last - 1] <= bound
        assert last - first == 1 or (last - first) * lens[first] <= max_positions
        assert last == len(lens) or lens[first] - lens[last] > bound or (last + 1 - first) * lens[first] > max_positions
