"""Preemption by swap with LZ4-compressed host blocks, modelled from a measured profile, not a guess.

The profile is what ``python -m paged.engine.swap_profile`` writes (``DEFAULT_PROFILE`` is one
measured on SmolLM2-135M's real KV): per kv_cache_dtype and codec, the compressed/raw ratio of
full blocks (``ratio_full_blocks``: a long context's blocks are full but its last) and the
single-thread ``compress_mb_s``/``decompress_mb_s``. What compression changes:

- Host capacity: none. The host pool holds ``swap_space_gib`` of raw blocks, as without
  compression, because that is all the engine's can promise: the core takes a host block before
  the block is compressed, and how far a block compresses depends on its content (noise-like
  values not at all), so a pool sized at ``1 / ratio`` times the blocks would overrun its memory
  whenever the blocks compressed worse than the profile (``paged.engine.swap_compression``).
  What compression saves is host memory, ``1 - ratio`` of what the swapped blocks take.
- Time: LZ4 runs on the host (the profile measured a CPU), so the raw block still crosses PCIe,
  and the host compresses it on the way out and decompresses it on the way back, on
  ``threads`` cores per GPU. The copy and the codec work on different blocks at once (a
  pipeline), so a block costs the slower of the two: ``max(B / pcie, B / (rate * threads))``
  for a GPU's ``B`` bytes of it. Out and in differ only in the codec's rate; the simulator
  charges one figure per block moved, and each swapped block moves out once and in once, so the
  mean of the two keeps every run's total exact (only which step pays shifts).

Not modelled: compressing on the GPU before the copy (nvCOMP), which would shorten the transfer
itself; nothing here measured it.
"""
from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass

from .cost_model import CostModel, _ticks
from .hardware import HardwareSpec
from .memory import KVPlan

DEFAULT_PROFILE = os.path.join(os.path.dirname(__file__), "profiles", "kv_swap_lz4.json")
CODECS = ("lz4", "lz4-shuffle")


@dataclass(slots=True, frozen=True)
class SwapProfile:
    ratio: float  # compressed bytes / raw bytes
    compress_mb_s: float  # raw MB/s, one thread
    decompress_mb_s: float
    source: str = ""

    @staticmethod
    def load(path: str, kv_cache_dtype: str, codec: str) -> SwapProfile:
        """The entry for ``kv_cache_dtype`` and ``codec`` of a ``paged.engine.swap_profile`` JSON."""
        if codec not in CODECS:
            raise ValueError(f"swap compression {codec!r}: expected one of {list(CODECS)}")
        with open(path) as f:
            profile = json.load(f)
        dtypes = profile["kv_cache_dtypes"]
        if kv_cache_dtype not in dtypes:
            raise ValueError(f"{path} has no LZ4 measurement for kv_cache_dtype {kv_cache_dtype!r} "
                             f"(it has {sorted(dtypes)}): run python -m paged.engine.swap_profile --dtypes "
                             f"{kv_cache_dtype} --out FILE and give --swap-profile FILE")
        entry = dtypes[kv_cache_dtype][codec]
        return SwapProfile(entry["ratio_full_blocks"], entry["compress_mb_s"], entry["decompress_mb_s"],
                           f"{profile['model']} {kv_cache_dtype} {codec}, {path}")

    def seconds_per_block(self, block_bytes_per_gpu: float, pcie_bandwidth: float, threads: int) -> float:
        """Mean time of one block's move out and back in (module docstring)."""
        transfer = block_bytes_per_gpu / pcie_bandwidth
        out = max(transfer, block_bytes_per_gpu / (self.compress_mb_s * 1e6 * threads))
        back = max(transfer, block_bytes_per_gpu / (self.decompress_mb_s * 1e6 * threads))
        return (out + back) / 2


def with_compressed_swap(cost_model: CostModel, profile: SwapProfile, plan: KVPlan, hardware: HardwareSpec, tp: int,
                         threads: int) -> CostModel:
    """``cost_model`` with its swap time per block replaced by the compressed one."""
    seconds = profile.seconds_per_block(plan.block_bytes / tp, hardware.pcie_bandwidth, threads)
    compressed = copy.copy(cost_model)
    compressed.swap_ticks_per_block = _ticks(seconds)
    compressed.name = f"{cost_model.name}+swap:{profile.source.split(',')[0]}"
    return compressed
