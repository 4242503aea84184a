"""reshape_and_cache and copy_blocks, both backends, against the oracle's loops."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kernels
from kernels import quant, reference
from tests.kernels.layouts import DEVICES, DTYPES

BACKENDS = ("triton", "torch")


@st.composite
def cache_shapes(draw):
    """(num_blocks, block_size, num_kv_heads, head_dim)."""
    return (
        draw(st.integers(1, 6)),
        draw(st.sampled_from([1, 2, 8, 16])),
        draw(st.integers(1, 3)),
        draw(st.sampled_from([8, 24, 64])),
    )


def garbage_cache(shape, dtype, device):
    if dtype == torch.int8:
        return torch.full(shape, -128, dtype=dtype, device=device)
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


@st.composite
def writes(draw, device):
    """(key, value, slot_mapping, cache shape): distinct slots, some tokens skipped with -1."""
    shape = draw(cache_shapes())
    num_slots = shape[0] * shape[1]
    stored = draw(st.permutations(range(num_slots)))[: draw(st.integers(0, min(num_slots, 12)))]
    slots = draw(st.permutations(stored + [-1] * draw(st.integers(0, 3))))
    index_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    num_tokens, (_, _, num_kv_heads, head_dim) = len(slots), shape
    # The engine may hand in views of a fused QKV projection: rows further apart than one token.
    spread = draw(st.sampled_from([1, 3]))
    fused = torch.randn(num_tokens, spread * 2 * num_kv_heads, head_dim, generator=generator)
    key, value = fused[:, :num_kv_heads], fused[:, -num_kv_heads:]
    slot_mapping = torch.tensor(slots, dtype=index_dtype)
    return key.to(device), value.to(device), slot_mapping.to(device), shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_reshape_and_cache_matches_oracle(device, backend, data, dtype):
    key, value, slot_mapping, shape = data.draw(writes(device))
    key, value = key.to(dtype), value.to(dtype)
    key_cache, value_cache = garbage_cache(shape, dtype, device), garbage_cache(shape, dtype, device)
    expected_key, expected_value = key_cache.cpu().clone(), value_cache.cpu().clone()
    reference.reshape_and_cache(key.cpu(), value.cpu(), expected_key, expected_value, slot_mapping.cpu())
    kernels.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, backend=backend)
    # Exact, and every slot not written still holds its garbage.
    torch.testing.assert_close(key_cache.cpu(), expected_key, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(value_cache.cpu(), expected_value, atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@given(data=st.data())
def test_float32_into_a_float16_cache_rounds_to_nearest(device, backend, data):
    """The oracle writes through torch's assignment, which rounds float32 to nearest even."""
    key, value, slot_mapping, shape = data.draw(writes(device))
    key_cache, value_cache = (garbage_cache(shape, torch.float16, device) for _ in range(2))
    expected_key, expected_value = key_cache.cpu().clone(), value_cache.cpu().clone()
    reference.reshape_and_cache(key.cpu(), value.cpu(), expected_key, expected_value, slot_mapping.cpu())
    kernels.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, backend=backend)
    torch.testing.assert_close(key_cache.cpu(), expected_key, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(value_cache.cpu(), expected_value, atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_quantized_write_is_close_and_backends_agree(device, data, dtype):
    key, value, slot_mapping, shape = data.draw(writes(device))
    key, value = key.to(dtype), value.to(dtype)
    results = {}
    for backend in BACKENDS:
        caches = [garbage_cache(shape, torch.int8, device) for _ in range(2)]
        scales = [torch.full(shape[:3], float("nan"), device=device) for _ in range(2)]
        kernels.reshape_and_cache(
            key, value, *caches, slot_mapping, k_scale=scales[0], v_scale=scales[1], backend=backend
        )
        results[backend] = [x.cpu() for x in caches + scales]

    stored = slot_mapping.cpu() >= 0
    slots = slot_mapping.cpu()[stored].long()
    key_cache, value_cache, k_scale, v_scale = results["triton"]
    for new, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        new = new.cpu()[stored].float()
        values, scales = cache.flatten(0, 1)[slots], scale.flatten(0, 1)[slots]
        # Each head's largest value is kept exactly; every value is within half a step.
        torch.testing.assert_close(scales, new.abs().amax(-1).clamp_min(quant.MIN_ABS_MAX) / quant.QUANT_MAX)
        error = (quant.dequantize(values, scales) - new).abs()
        assert (error <= scales[..., None] * 0.5001).all()
        # Slots not written keep their garbage.
        untouched = torch.ones(cache.shape[0] * cache.shape[1], dtype=torch.bool)
        untouched[slots] = False
        assert (cache.flatten(0, 1)[untouched] == -128).all()
        assert scale.flatten(0, 1)[untouched].isnan().all()
    for triton_result, torch_result in zip(results["triton"], results["torch"], strict=True):
        if triton_result.dtype == torch.int8:  # same bytes, up to a rounding tie on a GPU
            assert (triton_result.int() - torch_result.int()).abs().max() <= 1
        else:
            torch.testing.assert_close(triton_result, torch_result, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), magnitude=st.sampled_from([1e-3, 1.0, 300.0]))
def test_fp8_write_rounds_to_nearest_even_on_both_backends(device, data, dtype, magnitude):
    """torch's own float32 -> e4m3 cast (round to nearest even) is the oracle for the stored bytes; the
    values also sit within the format's bound, saturation at 448 * scale included."""
    key, value, slot_mapping, shape = data.draw(writes(device))
    key, value = (key * magnitude).to(dtype), (value * magnitude).to(dtype)
    heads = data.draw(st.sampled_from([1, shape[2]]))
    scale = torch.tensor(data.draw(st.lists(st.sampled_from([2**-6, 0.3, 1.0, 7.0]), min_size=heads, max_size=heads)),
                         device=device)
    stored = slot_mapping.cpu() >= 0
    slots = slot_mapping.cpu()[stored].long()
    for backend in BACKENDS:
        caches = [torch.full(shape, float("nan"), dtype=quant.FP8_DTYPE, device=device) for _ in range(2)]
        kernels.reshape_and_cache(key, value, *caches, slot_mapping, k_scale=scale, v_scale=scale, backend=backend)
        for new, cache in ((key, caches[0]), (value, caches[1])):
            new, cache = new.cpu()[stored].float(), cache.cpu()
            written = cache.flatten(0, 1)[slots]
            expected = (new / scale.cpu()[:, None]).clamp(-quant.FP8_MAX, quant.FP8_MAX).to(quant.FP8_DTYPE)
            assert torch.equal(written.view(torch.uint8), expected.view(torch.uint8))
            error = (quant.dequantize_fp8(written, scale.cpu()) - new).abs()
            assert (error <= quant.error_bound(new, "fp8", fp8_scale=scale.cpu())).all()
            untouched = torch.ones(cache.shape[0] * cache.shape[1], dtype=torch.bool)
            untouched[slots] = False
            assert cache.flatten(0, 1)[untouched].float().isnan().all()


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), group_size=st.sampled_from([2, 4, 8]))
def test_int4_write_is_within_half_a_step_and_backends_agree(device, data, dtype, group_size):
    key, value, slot_mapping, shape = data.draw(writes(device))
    key, value = key.to(dtype), value.to(dtype)
    packed_shape = (*shape[:3], shape[3] // 2)
    results = {}
    for backend in BACKENDS:
        caches = [torch.full(packed_shape, 255, dtype=quant.INT4_DTYPE, device=device) for _ in range(2)]
        scales = [torch.full((*shape[:3], shape[3] // group_size), float("nan"), device=device) for _ in range(2)]
        kernels.reshape_and_cache(
            key, value, *caches, slot_mapping, k_scale=scales[0], v_scale=scales[1], backend=backend
        )
        results[backend] = [x.cpu() for x in caches + scales]

    stored = slot_mapping.cpu() >= 0
    slots = slot_mapping.cpu()[stored].long()
    key_cache, value_cache, k_scale, v_scale = results["triton"]
    for new, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        new = new.cpu()[stored].float()
        values, scales = cache.flatten(0, 1)[slots], scale.flatten(0, 1)[slots]
        # Each group's largest value is kept exactly (to float32 rounding); every value within half a step.
        groups = new.abs().unflatten(-1, (-1, group_size)).amax(-1)
        torch.testing.assert_close(scales, groups.clamp_min(quant.MIN_ABS_MAX) / quant.INT4_MAX)
        error = (quant.dequantize_int4(values, scales) - new).abs()
        assert (error <= quant.error_bound(new, "int4", group_size=group_size)).all()
        untouched = torch.ones(cache.shape[0] * cache.shape[1], dtype=torch.bool)
        untouched[slots] = False
        assert (cache.flatten(0, 1)[untouched] == 255).all()
        assert scale.flatten(0, 1)[untouched].isnan().all()
    for triton_result, torch_result in zip(results["triton"], results["torch"], strict=True):
        if triton_result.dtype == quant.INT4_DTYPE:  # same nibbles, up to a rounding tie on a GPU
            for shift in (0, 4):
                assert ((triton_result.int() >> shift & 15) - (torch_result.int() >> shift & 15)).abs().max() <= 1
        else:
            torch.testing.assert_close(triton_result, torch_result, equal_nan=True)


@st.composite
def block_mappings(draw, num_blocks):
    """(src, dst) pairs: distinct destinations that are never also sources."""
    blocks = draw(st.permutations(range(num_blocks)))
    num_dst = draw(st.integers(0, num_blocks // 2))
    dst, sources = blocks[:num_dst], blocks[num_dst:]
    src = [draw(st.sampled_from(sources)) for _ in dst]  # a source may feed several copies
    index_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    return torch.tensor(list(zip(src, dst, strict=True)), dtype=index_dtype).reshape(-1, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@given(data=st.data(), dtype=st.sampled_from((*DTYPES, *quant.QUANTIZED_DTYPES)))
def test_copy_blocks_matches_oracle(device, backend, data, dtype):
    """Blocks (and int8/int4 per-token scales) move byte for byte; fp8's per-tensor scale is not per block."""
    shape = data.draw(cache_shapes())
    mapping = data.draw(block_mappings(shape[0]))
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**32 - 1)))
    if dtype == quant.INT4_DTYPE:
        shape = (*shape[:3], shape[3] // 2)
    caches = [torch.randn(shape, generator=generator).mul(50).to(dtype) for _ in range(2)]
    if dtype == torch.int8:
        caches += [torch.rand(shape[:3], generator=generator) for _ in range(2)]
    elif dtype == quant.INT4_DTYPE:
        caches += [torch.rand(*shape[:3], 2, generator=generator) for _ in range(2)]
    expected = [cache.clone() for cache in caches]
    reference.copy_blocks(expected, mapping)
    on_device = [cache.to(device) for cache in caches]
    scales = dict(zip(("k_scale", "v_scale"), on_device[2:], strict=False))
    if dtype == quant.FP8_DTYPE:
        scales = {"k_scale": torch.ones(1, device=device), "v_scale": torch.ones(1, device=device)}
    kernels.copy_blocks(*on_device[:2], mapping.to(device), **scales, backend=backend)
    for got, want in zip(on_device, expected, strict=True):
        assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8))
