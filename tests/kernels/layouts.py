"""Hypothesis strategies for paged batches: the shapes and layouts that break attention kernels.

A drawn batch mixes decode, prefill and chunked-prefill sequences whose lengths favour the
edges (1, a block exactly, one past a block), scatters their blocks over the cache in random
order, lets later sequences share leading blocks of earlier ones, pads the block table with
nonsense past each sequence's last block, and fills every cache slot that no sequence reads
with garbage (NaN, or extreme int8/int4 values with NaN scales), so any stray read shows up.

Tensor contents come from a torch generator seeded by one drawn integer: hypothesis shrinks
the layout, not a million floats.
"""

import os
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from kernels import quant, reference

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (atol, rtol) of a fast path against the float32 oracle, by query dtype. Both read the same
# cache values; the gap is output rounding plus, on GPUs, probabilities rounded to the input
# dtype before the P @ V product.
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.float16: (3e-3, 3e-3), torch.bfloat16: (2e-2, 2e-2)}
GARBAGE_BLOCK_IDS = (-1, -(2**31), 2**31 - 1, 1_000_000)


def _devices() -> list[str]:
    """KERNELS_TEST_DEVICES=cpu,cuda picks devices; by default the CPU and CUDA when present."""
    chosen = os.environ.get("KERNELS_TEST_DEVICES")
    if chosen:
        return chosen.split(",")
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


DEVICES = _devices()


def max_seq_len(device: str) -> int:
    """Sequences stay short under the interpreter (every program is Python); a GPU takes longer ones."""
    return 40 if device == "cpu" else 600


@dataclass
class PagedBatch:
    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    scale: float
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    def args(self) -> tuple:
        """Positional arguments of ``paged_attention``."""
        return (
            self.query,
            self.key_cache,
            self.value_cache,
            self.block_table,
            self.seq_lens,
            self.query_start_loc,
            self.scale,
        )

    def scales(self) -> dict:
        """Keyword arguments for a quantized cache (empty for a float one)."""
        return {} if self.k_scale is None else {"k_scale": self.k_scale, "v_scale": self.v_scale}

    def assert_matches_oracle(self, out: torch.Tensor) -> None:
        """``out`` is this batch's attention, within the query dtype's tolerance of the oracle."""
        on_cpu = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()}
        expected = reference.paged_attention(**on_cpu)
        assert out.dtype == self.query.dtype and out.shape == self.query.shape
        atol, rtol = TOLERANCES[self.query.dtype]
        torch.testing.assert_close(out.float().cpu(), expected, atol=atol, rtol=rtol)


@st.composite
def _seq_len(draw, block_size: int, longest: int) -> int:
    edges = [n for n in (1, block_size, block_size + 1, 2 * block_size, 3 * block_size - 1) if 1 <= n <= longest]
    return draw(st.sampled_from(edges) | st.integers(1, longest))


@st.composite
def _query_len(draw, seq_len: int) -> int:
    kind = draw(st.sampled_from(["decode", "prefill", "chunked"]))
    if kind == "decode":
        return 1
    if kind == "prefill":
        return seq_len
    return draw(st.integers(1, seq_len))


QUANTIZED_FORMATS = ("int8", "fp8", "int4")


@st.composite
def cache_formats(draw, kv_format: str | None, head_dim: int) -> dict:
    """How a cache of ``kv_format`` stores ``head_dim`` channels: fp8's scale (per tensor or head, large
    or small, so values land in e4m3's subnormals and near its 448 limit) or int4's group size."""
    if kv_format == "fp8":
        return {"fp8_scale": draw(st.sampled_from([1.0, 2**-8, 0.37, 40.0])), "per_head": draw(st.booleans())}
    if kv_format == "int4":
        return {"group_size": draw(st.sampled_from([g for g in (2, 4, 8, 32) if head_dim % g == 0]))}
    return {}


def _fill_cache(shape, slots, dtype, kv_format, layout, generator):
    """Cache with random values in ``slots`` and garbage elsewhere; (cache, scale or None)."""
    num_blocks, block_size, num_kv_heads, head_dim = shape
    values = torch.randn(len(slots), num_kv_heads, head_dim, generator=generator)
    slots = torch.tensor(slots, dtype=torch.long)
    if kv_format in (None, "float16"):
        dtype = getattr(torch, kv_format) if kv_format else dtype
        cache = torch.full(shape, float("nan"), dtype=dtype)
        cache.flatten(0, 1)[slots] = values.to(dtype)
        return cache, None
    if kv_format == "fp8":  # unused slots hold NaN; the scale is read whole, so it cannot be garbage
        cache = torch.full(shape, float("nan"), dtype=quant.FP8_DTYPE)
        heads = num_kv_heads if layout["per_head"] else 1
        scale = layout["fp8_scale"] * (1 + torch.rand(heads, generator=generator))
        cache.flatten(0, 1)[slots] = quant.quantize_fp8(values, scale)
        return cache, scale
    if kv_format == "int4":
        group_size = layout["group_size"]
        cache = torch.full((*shape[:3], head_dim // 2), 255, dtype=quant.INT4_DTYPE)
        scale = torch.full((*shape[:3], head_dim // group_size), float("nan"))
        cache.flatten(0, 1)[slots], scale.flatten(0, 1)[slots] = quant.quantize_int4(values, group_size)
        return cache, scale
    cache = torch.full(shape, -128, dtype=torch.int8)
    scale = torch.full(shape[:3], float("nan"))
    cache.flatten(0, 1)[slots], scale.flatten(0, 1)[slots] = quant.quantize(values)
    return cache, scale


@st.composite
def paged_batches(draw, device: str = "cpu", dtype=None, kv_format: str | None = None, max_seqs: int = 4):
    """A :class:`PagedBatch` on ``device``; ``dtype=None`` draws one of :data:`DTYPES`; ``kv_format``:
    None for a cache of the query's dtype, "float16" for one under float32 queries, or one of
    :data:`QUANTIZED_FORMATS`."""
    dtype = dtype or draw(st.sampled_from(DTYPES))
    block_size = draw(st.sampled_from([1, 2, 8, 16, 32]))
    head_dim = draw(st.sampled_from([8, 16, 24, 64]))
    num_kv_heads = draw(st.integers(1, 2))
    num_heads = num_kv_heads * draw(st.sampled_from([1, 2, 3, 4, 8]))
    longest = max_seq_len(device)
    seq_lens = draw(st.lists(_seq_len(block_size, longest), min_size=1, max_size=max_seqs))
    query_lens = [draw(_query_len(seq_len)) for seq_len in seq_lens]

    # Block tables: each sequence's blocks, some borrowed from an earlier sequence's head.
    tables: list[list[int]] = []
    num_blocks = 0
    for seq_len in seq_lens:
        needed = -(-seq_len // block_size)
        table = []
        if tables and draw(st.booleans()):
            donor = draw(st.sampled_from(tables))
            table = donor[: draw(st.integers(0, min(needed, len(donor))))]
        fresh = needed - len(table)
        table = table + list(range(num_blocks, num_blocks + fresh))
        num_blocks += fresh
        tables.append(table)
    num_blocks += draw(st.integers(0, 3))  # blocks nobody uses
    placement = draw(st.permutations(range(num_blocks)))  # scatter logical ids over the cache
    width = max(len(table) for table in tables) + draw(st.integers(0, 2))
    garbage = draw(st.sampled_from(GARBAGE_BLOCK_IDS))
    block_table = torch.full((len(seq_lens), width), garbage, dtype=torch.int32)
    for seq, table in enumerate(tables):
        block_table[seq, : len(table)] = torch.tensor([placement[b] for b in table], dtype=torch.int32)

    read_slots = sorted(
        {
            int(block_table[seq, position // block_size]) * block_size + position % block_size
            for seq, seq_len in enumerate(seq_lens)
            for position in range(seq_len)
        }
    )
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    layout = draw(cache_formats(kv_format, head_dim))
    key_cache, k_scale = _fill_cache(shape, read_slots, dtype, kv_format, layout, generator)
    value_cache, v_scale = _fill_cache(shape, read_slots, dtype, kv_format, layout, generator)
    query = torch.randn(sum(query_lens), num_heads, head_dim, generator=generator).to(dtype)
    starts = torch.tensor([0, *query_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)

    def on_device(x):
        return None if x is None else x.to(device)

    return PagedBatch(
        query=on_device(query),
        key_cache=on_device(key_cache),
        value_cache=on_device(value_cache),
        block_table=on_device(block_table),
        seq_lens=on_device(torch.tensor(seq_lens, dtype=torch.int32)),
        query_start_loc=on_device(starts),
        scale=head_dim**-0.5,
        k_scale=on_device(k_scale),
        v_scale=on_device(v_scale),
    )
