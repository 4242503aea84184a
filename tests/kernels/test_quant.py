"""The quantized cache formats (int8, fp8, int4), their error bounds, and the report of what they save and cost."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import quant, quant_report


@given(
    seed=st.integers(0, 2**32 - 1),
    magnitude=st.sampled_from([0.0, 1e-20, 1e-3, 1.0, 1e4]),
    head_dim=st.sampled_from([1, 8, 128]),
)
def test_round_trip_within_half_a_step(seed, magnitude, head_dim):
    x = torch.randn(5, 3, head_dim, generator=torch.Generator().manual_seed(seed)) * magnitude
    values, scale = quant.quantize(x)
    assert values.dtype == torch.int8 and scale.shape == x.shape[:-1]
    assert values.abs().max() <= 127 and torch.isfinite(scale).all() and (scale > 0).all()
    assert ((quant.dequantize(values, scale) - x).abs() <= scale[..., None] * 0.5001).all()


def test_largest_value_of_a_head_is_exact():
    x = torch.tensor([[0.5, -2.0, 1.0]])
    values, scale = quant.quantize(x)
    assert values.tolist() == [[32, -127, 64]]
    assert quant.dequantize(values, scale)[0, 1] == -2.0


def test_bytes_per_token():
    assert quant.cache_bytes_per_token(8, 128, torch.float16) == 2 * 8 * 128 * 2
    assert quant.cache_bytes_per_token(8, 128, torch.int8) == 2 * 8 * (128 + 4)
    assert quant.cache_bytes_per_token(8, 128, "fp8") == 2 * 8 * 128
    assert quant.cache_bytes_per_token(8, 128, "int4") == 2 * 8 * (64 + 4 * 128 // 32)
    assert quant.cache_bytes_per_token(8, 128, "int4", group_size=128) == 2 * 8 * (64 + 4)


@given(
    seed=st.integers(0, 2**32 - 1),
    magnitude=st.sampled_from([0.0, 1e-20, 1e-3, 1.0, 1e4]),
    group_size=st.sampled_from([2, 8, 32]),
    outliers=st.booleans(),
)
def test_int4_round_trip_within_its_bound(seed, magnitude, group_size, outliers):
    x = torch.randn(5, 3, 64, generator=torch.Generator().manual_seed(seed)) * magnitude
    if outliers:
        x[..., :2] *= 10.0
    packed, scale = quant.quantize_int4(x, group_size)
    assert packed.dtype == torch.uint8 and packed.shape == (5, 3, 32) and scale.shape == (5, 3, 64 // group_size)
    assert torch.isfinite(scale).all() and (scale > 0).all()
    error = (quant.dequantize_int4(packed, scale) - x).abs()
    assert (error <= quant.error_bound(x, "int4", group_size=group_size)).all()


def test_int4_packs_low_nibble_first_offset_by_8():
    x = torch.tensor([[7.0, -7.0, 0.0, 1.0]])
    packed, scale = quant.quantize_int4(x, group_size=4)
    assert scale.tolist() == [[1.0]]
    assert packed.tolist() == [[(7 + 8) | ((-7 + 8) << 4), (0 + 8) | ((1 + 8) << 4)]]
    assert quant.dequantize_int4(packed, scale).tolist() == x.tolist()


@given(seed=st.integers(0, 2**32 - 1), magnitude=st.sampled_from([1e-4, 1.0, 100.0, 1e4]),
       per_head=st.booleans())
def test_fp8_round_trip_within_its_bound(seed, magnitude, per_head):
    """Below 2**-6 * scale the subnormals' absolute bound applies, past 448 * scale saturation."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(7, 3, 16, generator=generator) * magnitude
    scale = torch.rand(3 if per_head else 1, generator=generator) + 0.1
    error = (quant.dequantize_fp8(quant.quantize_fp8(x, scale), scale) - x).abs()
    assert (error <= quant.error_bound(x, "fp8", fp8_scale=scale)).all()


def test_fp8_saturates_and_keeps_grid_values():
    x = torch.tensor([[[448.0, -1000.0, 1.125, 2.0**-9]]])
    stored = quant.dequantize_fp8(quant.quantize_fp8(x, torch.ones(1)), torch.ones(1))
    assert stored.tolist() == [[[448.0, -448.0, 1.125, 2.0**-9]]]


@pytest.mark.parametrize("head_dim", [7, 63])
def test_int4_refuses_an_odd_head_dim(head_dim):
    with pytest.raises(ValueError, match="head_dim .* is odd"):
        quant.int4_group_size(head_dim)


def test_int4_group_size_is_the_largest_power_of_two_dividing_head_dim():
    assert [quant.int4_group_size(d) for d in (64, 128, 80, 96, 6)] == [32, 32, 16, 32, 2]
    with pytest.raises(ValueError, match="group_size 3"):
        quant.quantize_int4(torch.zeros(1, 6), 3)


def test_report_memory_per_format():
    memory = quant_report.memory_per_format(8, 128)
    assert memory == {"float16": 4096, "int8": 2112, "fp8": 2048, "int4": 1280}


@settings(max_examples=6)
@given(
    backend=st.sampled_from(["torch", "triton"]),
    num_kv_heads=st.integers(1, 2),
    queries_per_kv=st.sampled_from([1, 3]),
    head_dim=st.sampled_from([16, 32]),
    outlier_channels=st.sampled_from([0, 2]),
    seed=st.integers(0, 2**16),
)
def test_quantized_attention_stays_within_the_derived_bound(backend, num_kv_heads, queries_per_kv, head_dim,
                                                           outlier_channels, seed):
    """The end-to-end claim: writing K/V in each format and attending over them (either backend) moves the
    output by no more than the bound derived in kernels.quant_report, for float32 queries."""
    errors = quant_report.attention_errors(
        num_seqs=2, seq_len=24, query_len=3, num_heads=num_kv_heads * queries_per_kv, num_kv_heads=num_kv_heads,
        head_dim=head_dim, block_size=8, outlier_channels=outlier_channels, group_size=8, backend=backend, seed=seed,
    )
    for kv_format in quant_report.FORMATS:
        assert errors[kv_format]["within_bound"], (kv_format, errors[kv_format])
        assert 0 < errors[kv_format]["max_abs"] <= errors[kv_format]["bound_max"] + quant_report.FLOAT32_ATOL


def test_attention_bound_is_broken_by_errors_past_it():
    """The bound is not vacuous: a value error past it breaks it, and exact K/V have a bound of zero."""
    query, key, value = torch.randn(2, 2, 8), torch.randn(5, 1, 8), torch.randn(5, 1, 8)
    zero = torch.zeros_like(key)
    assert quant_report.attention_error_bound(query, key, value, zero, zero, 0.3).abs().max() == 0
    bound = quant_report.attention_error_bound(query, key, value, zero, torch.full_like(value, 0.01), 0.3)
    assert torch.allclose(bound, torch.full_like(bound, 0.01))
