"""Compressed swap in the simulator: swap time from a measured LZ4 profile; host capacity as the
engine's, which compression does not raise (sim.compressed_swap says why)."""
import json

import pytest

from sim import SimConfig
from sim.compressed_swap import DEFAULT_PROFILE, SwapProfile
from sim.hardware import get_hardware
from sim.runner import build_cache_config, build_cost_model, kv_plan


@pytest.fixture
def profile_path(tmp_path):
    """Half the bytes; compression at 1 GB/s, decompression at 4 GB/s on one thread."""
    path = tmp_path / "swap.json"
    entry = {"ratio_full_blocks": 0.5, "compress_mb_s": 1000.0, "decompress_mb_s": 4000.0}
    path.write_text(json.dumps({"model": "test", "kv_cache_dtypes": {"fp16": {"lz4": entry, "lz4-shuffle": entry}}}))
    return str(path)


def test_seconds_per_block_is_the_slower_of_copy_and_codec_averaged_over_out_and_in():
    p = SwapProfile(ratio=0.5, compress_mb_s=1000.0, decompress_mb_s=4000.0)
    # 1 MB over 2 GB/s PCIe: 0.5 ms; compress 1 ms (codec-bound), decompress 0.25 ms (copy-bound).
    assert p.seconds_per_block(1e6, 2e9, threads=1) == pytest.approx((1e-3 + 0.5e-3) / 2)
    # Four threads: compression at 0.25 ms, the copy bounds both ways.
    assert p.seconds_per_block(1e6, 2e9, threads=4) == pytest.approx(0.5e-3)


def test_compressed_swap_holds_as_many_blocks_and_charges_the_codec(profile_path):
    plain = SimConfig(model="llama-2-7b", preemption="swap")
    lz4 = SimConfig(model="llama-2-7b", preemption="swap", swap_compression="lz4", swap_profile=profile_path)
    plain_blocks, lz4_blocks = build_cache_config(plain).num_cpu_blocks, build_cache_config(lz4).num_cpu_blocks
    assert lz4_blocks == plain_blocks > 0  # a ratio of 0.5, and still no more blocks
    block = kv_plan(plain).block_bytes
    pcie = get_hardware(plain.hardware).pcie_bandwidth
    plain_s, lz4_s = (build_cost_model(c).step_seconds(num_swapped_blocks=1) - build_cost_model(c).step_seconds()
                      for c in (plain, lz4))
    assert plain_s == pytest.approx(block / pcie, rel=1e-6)
    assert lz4_s == pytest.approx((block / 1e9 + max(block / pcie, block / 4e9)) / 2, rel=1e-6)


def test_bad_settings_are_refused(profile_path):
    with pytest.raises(ValueError, match="swap_compression='zstd'"):
        SimConfig(swap_compression="zstd")
    with pytest.raises(ValueError, match="no LZ4 measurement for kv_cache_dtype 'int4'"):
        build_cache_config(SimConfig(kv_cache_dtype="int4", preemption="swap", swap_compression="lz4",
                                     swap_profile=profile_path))


@pytest.mark.parametrize("kv_cache_dtype", ["fp16", "fp8", "int8", "int4"])
def test_the_measured_profile_covers_every_kv_dtype(kv_cache_dtype):
    for codec in ("lz4", "lz4-shuffle"):
        p = SwapProfile.load(DEFAULT_PROFILE, kv_cache_dtype, codec)
        assert 0 < p.ratio <= 1.01 and p.compress_mb_s > 0 and p.decompress_mb_s > 0
