"""The int8 cache format and the report of what it saves and costs."""

import torch
from hypothesis import given
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


def test_report_int8_saves_memory_at_a_bounded_cost():
    plain, compressed, saved = quant_report.memory_saving(8, 128, torch.float16)
    assert compressed < plain and 0.45 < saved < 0.5
    errors = quant_report.attention_errors(num_seqs=2, seq_len=40, num_heads=4, num_kv_heads=2, head_dim=32)
    assert errors["float16"]["relative"] < errors["int8"]["relative"] < 0.03
