"""Paged attention in Triton: one kernel for decode, prefill and chunked prefill in a mixed batch.

Work split. A program owns ``BLOCK_Q`` consecutive query tokens of one sequence and one KV
head, and with them all ``QUERIES_PER_KV`` query heads that read that KV head: the tile of
queries is ``BLOCK_M = BLOCK_Q * QUERIES_PER_KV`` rows (padded to a power of two), so each K/V
tile loaded from memory serves every head of its group (GQA without repeating K/V) and a decode
step still fills the 16 rows ``tl.dot`` needs.

Finding the sequence without a host sync. Programs are numbered as if sequence ``i`` started at
``query_start_loc[i] // BLOCK_Q + i``: the ``+ i`` gives each sequence one spare program, enough
that flooring never leaves it fewer than ``cdiv(q_len, BLOCK_Q)``, so ``num_tokens // BLOCK_Q +
num_seqs`` programs cover every batch. A program finds its sequence by binary search over those
starts, and the spare ones return at once. With ``BLOCK_Q == 1`` (decode) nothing is floored and
the spares are dropped (``SEQ_SLACK = 0``). No maximum query length is read back from the GPU.

K/V tiles. The key loop walks ``TILE_N`` positions at a time and looks up every position's block
in the block table, so a tile may span several small blocks or part of a large one: block size
and tile size are independent. Positions past the causal limit are masked at load time, so
nothing outside the sequence is ever read (an unused slot may hold NaN).

Online softmax in float32, base 2 (``exp2`` with the scale folded into ``log2(e) * scale``).

Split-KV. With few sequences and long contexts, one program per (query tile, KV head) leaves
most of the GPU idle, so ``NUM_SPLITS > 1`` cuts each program's key range into contiguous
splits, run as separate programs; each writes its partial output normalised by its own sum plus
its log-sum-exp, and ``_combine_splits_kernel`` merges them weighting each by
``exp2(lse_split - lse_max)``. An empty split (its range starts past the causal limit) has
lse = -inf and weighs nothing.

Quantized cache. int8 K/V carry one scale per token and head (``kernels.quant``); because the
scale is per key, it factors out of the dot products: ``q . (k * s_k) = (q . k) * s_k`` scales a
column of the score tile, and ``sum_n p_n * (v_n * s_v,n) = sum_n (p_n * s_v,n) * v_n`` scales a
column of the probability tile. The int8 values themselves go to ``tl.dot`` converted exactly
to the query's type; nothing is dequantized element by element. fp8 (e4m3) values convert
exactly to float16, bfloat16 and float32 too, and their static scale is one number per KV head,
so a program applies it once: to the scores for K, to the output for V. int4 is the exception:
its scales vary along ``head_dim`` (one per group of channels), so they do not factor out of a
dot product over ``head_dim``; each tile is unpacked (low nibble channel ``2j``, high ``2j + 1``,
``tl.interleave`` puts them back in order) and dequantized element by element before ``tl.dot``.
"""

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.cache_ops import FLOAT, FP8, INT4, INT8, kv_format
from kernels.jit import Kernel

LOG2_E = 1.4426950408889634


@Kernel
def _paged_attention_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim], contiguous
    partial_out_ptr,  # [num_tokens, num_heads, NUM_SPLITS, head_dim] float32 (split-KV only)
    partial_lse_ptr,  # [num_tokens, num_heads, NUM_SPLITS] float32 (split-KV only)
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    k_scale_ptr,  # float32, quantized only: int8 [blocks, block_size, kv_heads], fp8 [1]/[kv_heads], int4 [.., groups]
    v_scale_ptr,
    block_table_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    qk_scale,  # softmax scale * log2(e)
    num_seqs,
    num_heads,
    stride_query_token,
    stride_query_head,
    stride_block_table,
    stride_cache_block,
    stride_cache_token,
    stride_cache_head,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    QUERIES_PER_KV: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SEQ_SEARCH_STEPS: tl.constexpr,
    SEQ_SLACK: tl.constexpr,
    KV_FORMAT: tl.constexpr,  # kernels.cache_ops: FLOAT, INT8, FP8 or INT4
    FP8_SCALE_STRIDE: tl.constexpr,  # 0: one fp8 scale per tensor; 1: one per KV head
    NUM_GROUPS: tl.constexpr,  # int4 scales per token and head
    DOT_FP32: tl.constexpr,  # interpreter only: its tl.dot is wrong on bfloat16
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 inputs, so float32 means float32 (not tf32)
):
    program = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_kv_heads = tl.num_programs(1)

    # The last sequence whose first program is at or before this one.
    lo = 0
    hi = num_seqs
    for _ in tl.static_range(SEQ_SEARCH_STEPS):
        mid = (lo + hi) // 2
        at_or_before = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid * SEQ_SLACK <= program
        lo = tl.where(at_or_before, mid, lo)
        hi = tl.where(at_or_before, hi, mid)
    seq = lo
    query_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - query_start
    query_block = program - (query_start // BLOCK_Q + seq * SEQ_SLACK)
    if query_block * BLOCK_Q >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len

    rows = tl.arange(0, BLOCK_M)
    row_token = query_block * BLOCK_Q + rows // QUERIES_PER_KV  # index among this sequence's queries
    row_head = kv_head * QUERIES_PER_KV + rows % QUERIES_PER_KV
    row_valid = (rows < BLOCK_Q * QUERIES_PER_KV) & (row_token < query_len)
    row_position = context_len + row_token
    row_global_token = (query_start + row_token).to(tl.int64)
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_valid = dims < HEAD_DIM

    q = tl.load(
        query_ptr
        + row_global_token[:, None] * stride_query_token
        + row_head[:, None] * stride_query_head
        + dims[None, :],
        mask=row_valid[:, None] & dim_valid[None, :],
        other=0.0,
    )
    if DOT_FP32:
        q = q.to(tl.float32)

    # Keys this program can see: up to its last query token's position.
    kv_end = tl.minimum(seq_len, context_len + (query_block + 1) * BLOCK_Q)
    num_tiles = tl.cdiv(kv_end, TILE_N)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    tile_start = split * tiles_per_split
    tile_end = tl.minimum(tile_start + tiles_per_split, num_tiles)

    if KV_FORMAT == FP8:
        k_head_scale = tl.load(k_scale_ptr + kv_head * FP8_SCALE_STRIDE)
        v_head_scale = tl.load(v_scale_ptr + kv_head * FP8_SCALE_STRIDE)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    for tile in range(tile_start, tile_end):
        key_position = tile * TILE_N + tl.arange(0, TILE_N)
        key_valid = key_position < kv_end
        block_id = tl.load(
            block_table_ptr + seq * stride_block_table + key_position // BLOCK_SIZE, mask=key_valid, other=0
        ).to(tl.int64)
        offset_in_block = key_position % BLOCK_SIZE
        slot_offset = block_id * stride_cache_block + offset_in_block * stride_cache_token + kv_head * stride_cache_head
        scale_offset = (block_id * BLOCK_SIZE + offset_in_block) * num_kv_heads + kv_head
        if KV_FORMAT == INT4:
            k = _load_int4(key_cache_ptr, k_scale_ptr, slot_offset, scale_offset, key_valid, HEAD_DIM, HEAD_DIM_PAD,
                           NUM_GROUPS).to(q.dtype)
            v = _load_int4(value_cache_ptr, v_scale_ptr, slot_offset, scale_offset, key_valid, HEAD_DIM, HEAD_DIM_PAD,
                           NUM_GROUPS).to(q.dtype)
        else:
            kv_mask = key_valid[:, None] & dim_valid[None, :]
            k = tl.load(key_cache_ptr + slot_offset[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(q.dtype)
            v = tl.load(value_cache_ptr + slot_offset[:, None] + dims[None, :], mask=kv_mask, other=0.0).to(q.dtype)

        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        if KV_FORMAT == INT8:
            scores = scores * tl.load(k_scale_ptr + scale_offset, mask=key_valid, other=0.0)[None, :]
        elif KV_FORMAT == FP8:
            scores = scores * k_head_scale
        scores = scores * qk_scale
        visible = key_valid[None, :] & (key_position[None, :] <= row_position[:, None])
        scores = tl.where(visible, scores, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        # A row may see nothing in this tile (split-KV, padded rows): keep exp2 away from -inf - -inf.
        m_base = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(scores - m_base[:, None])
        alpha = tl.exp2(m_i - m_base)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if KV_FORMAT == INT8:
            p = p * tl.load(v_scale_ptr + scale_offset, mask=key_valid, other=0.0)[None, :]
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)  # l_i == 0: nothing seen (an empty split, a padded row)
    out = acc / l_safe[:, None]
    if KV_FORMAT == FP8:
        out = out * v_head_scale
    store_mask = row_valid[:, None] & dim_valid[None, :]
    if NUM_SPLITS == 1:
        out_offset = (row_global_token * num_heads + row_head) * HEAD_DIM
        tl.store(out_ptr + out_offset[:, None] + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=store_mask)
    else:
        partial = (row_global_token * num_heads + row_head) * NUM_SPLITS + split
        tl.store(partial_out_ptr + partial[:, None] * HEAD_DIM + dims[None, :], out, mask=store_mask)
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(partial_lse_ptr + partial, lse, mask=row_valid)


@triton.jit
def _load_int4(cache_ptr, scale_ptr, slot_offset, scale_offset, key_valid, HEAD_DIM: tl.constexpr,
               HEAD_DIM_PAD: tl.constexpr, NUM_GROUPS: tl.constexpr):
    """K or V of a tile from an int4 cache, float32 ``[TILE_N, HEAD_DIM_PAD]`` (zero where masked).

    ``slot_offset``: each key's first byte; ``scale_offset``: its (token, head) index, whose
    NUM_GROUPS scales follow one another. Byte ``j`` holds channels ``2j`` (low) and ``2j + 1``,
    both in group ``2j // group_size``."""
    pairs = tl.arange(0, HEAD_DIM_PAD // 2)
    mask = key_valid[:, None] & (pairs < HEAD_DIM // 2)[None, :]
    packed = tl.load(cache_ptr + slot_offset[:, None] + pairs[None, :], mask=mask, other=0).to(tl.int32)
    group = (2 * pairs) // (HEAD_DIM // NUM_GROUPS)
    scale = tl.load(scale_ptr + scale_offset[:, None] * NUM_GROUPS + group[None, :], mask=mask, other=0.0)
    low = ((packed & 15) - 8).to(tl.float32) * scale
    high = ((packed >> 4) - 8).to(tl.float32) * scale
    return tl.interleave(low, high)


@Kernel
def _combine_splits_kernel(
    out_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    """One program per (token, head): merge the splits' partial outputs by their log-sum-exp."""
    row = tl.program_id(0).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    split_valid = splits < NUM_SPLITS
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_valid = dims < HEAD_DIM
    lse = tl.load(partial_lse_ptr + row * NUM_SPLITS + splits, mask=split_valid, other=float("-inf"))
    # Every query token sees at least itself, so some split's lse is finite.
    weights = tl.exp2(lse - tl.max(lse, axis=0))
    partial = tl.load(
        partial_out_ptr + (row * NUM_SPLITS + splits)[:, None] * HEAD_DIM + dims[None, :],
        mask=split_valid[:, None] & dim_valid[None, :],
        other=0.0,
    )
    out = tl.sum(weights[:, None] * partial, axis=0) / tl.sum(weights, axis=0)
    tl.store(out_ptr + row * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty), mask=dim_valid)


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, triton.next_power_of_2(n))


@dataclass(frozen=True)
class TileShape:
    block_q: int  # query tokens per program
    block_m: int  # rows of the query tile: block_q * queries_per_kv, padded to a power of two
    tile_n: int  # keys per loop step
    head_dim_pad: int
    num_warps: int

    @staticmethod
    def choose(decode_only: bool, queries_per_kv: int, head_dim: int, dtype: torch.dtype, device: torch.device,
               kv_format: int = FLOAT):
        """Tiles per batch kind, dtype and device.

        Decode gets one query token per program (rows = its GQA group, at least the 16 ``tl.dot``
        needs); prefill fills 128 rows to keep tensor cores busy. float32 tiles are smaller: its
        exact ("ieee") products run on FMA units and need registers, and at the bf16 sizes they
        spill. The GPU shapes compile without register spills for sm_80 and sm_90 (checked by
        ptxas in tests/kernels/test_compile.py). An int4 cache halves the key tile: unpacking holds
        the bytes, the scales and both halves of each K/V tile in registers at once, and a 128-row
        prefill at 64 keys spilled 340 bytes on sm_80. Under the interpreter, small tiles keep the
        tests quick and still cross block boundaries inside a sequence.
        """
        on_gpu = device.type != "cpu"
        head_dim_pad = _pow2_at_least(head_dim, 16)
        wide = on_gpu and dtype != torch.float32
        if decode_only:
            block_m = _pow2_at_least(queries_per_kv, 16)
            block_q = 1
        else:
            block_m = _pow2_at_least(queries_per_kv, 128 if wide else 64 if on_gpu else 32)
            block_q = block_m // queries_per_kv
        tile_n = (64 if head_dim_pad <= 128 and kv_format != INT4 else 32) if wide else 16
        num_warps = 8 if on_gpu and (block_m >= 128 or not wide) else 4
        return TileShape(block_q, block_m, tile_n, head_dim_pad, num_warps)


def choose_num_splits(num_programs: int, max_context: int, decode_only: bool, device: torch.device) -> int:
    """How many ways to split each program's keys: enough programs to fill the GPU twice over.

    Only decode batches are split: a prefill tile already has work enough. ``max_context`` is an
    upper bound (the block table's capacity) so no length has to be read back; splits past a
    sequence's real end are empty and cost one early store. Each split keeps at least 512 keys
    so its fixed cost stays small. The interpreter never splits unless asked.
    """
    if device.type != "cuda" or not decode_only:
        return 1
    wanted = triton.cdiv(2 * _num_sms(device), num_programs)
    return max(1, min(wanted, triton.cdiv(max_context, 512), 64))


def paged_attention(
    query,
    key_cache,
    value_cache,
    block_table,
    seq_lens,
    query_start_loc,
    scale,
    out,
    k_scale=None,
    v_scale=None,
    num_splits=None,
):
    """Same contract as ``kernels.dispatch.paged_attention``, inputs already checked.

    ``num_splits`` forces the split-KV path (tests, benchmarks); by default
    :func:`choose_num_splits` decides.
    """
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    num_seqs = seq_lens.shape[0]
    queries_per_kv = num_heads // num_kv_heads
    device = query.device
    if num_tokens == 0:
        return out
    if query.stride(-1) != 1:
        query = query.contiguous()
    # The kernel walks these small index tensors as packed arrays: a strided view (a slice,
    # a transpose) would be read wrong. Copying them costs nothing next to the attention.
    block_table, seq_lens = block_table.contiguous(), seq_lens.contiguous()
    query_start_loc = query_start_loc.contiguous()

    decode_only = num_tokens == num_seqs
    fmt = kv_format(key_cache)
    tiles = TileShape.choose(decode_only, queries_per_kv, head_dim, query.dtype, device, fmt)
    block_q, block_m = tiles.block_q, tiles.block_m
    seq_slack = 1 if block_q > 1 else 0
    num_programs = num_tokens // block_q + num_seqs * seq_slack
    if num_splits is None:
        num_splits = choose_num_splits(
            num_programs * num_kv_heads, block_table.shape[1] * block_size, decode_only, device
        )

    if num_splits == 1:
        partial_out = partial_lse = out  # not touched: NUM_SPLITS == 1 stores straight to out
    else:
        partial_out = torch.empty(num_tokens, num_heads, num_splits, head_dim, dtype=torch.float32, device=device)
        partial_lse = torch.empty(num_tokens, num_heads, num_splits, dtype=torch.float32, device=device)
    _paged_attention_kernel.on(device)[(num_programs, num_kv_heads, num_splits)](
        out,
        partial_out,
        partial_lse,
        query,
        key_cache,
        value_cache,
        key_cache if k_scale is None else k_scale,
        value_cache if v_scale is None else v_scale,
        block_table,
        seq_lens,
        query_start_loc,
        scale * LOG2_E,
        num_seqs,
        num_heads,
        query.stride(0),
        query.stride(1),
        block_table.stride(0),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=tiles.head_dim_pad,
        BLOCK_SIZE=block_size,
        QUERIES_PER_KV=queries_per_kv,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        TILE_N=tiles.tile_n,
        NUM_SPLITS=num_splits,
        SEQ_SEARCH_STEPS=max(1, (num_seqs - 1).bit_length()),  # ceil(log2(num_seqs))
        SEQ_SLACK=seq_slack,
        KV_FORMAT=fmt,
        FP8_SCALE_STRIDE=1 if fmt == FP8 and k_scale.numel() > 1 else 0,
        NUM_GROUPS=k_scale.shape[-1] if fmt == INT4 else 1,
        DOT_FP32=_paged_attention_kernel.interprets(device),
        DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        num_warps=tiles.num_warps,
        num_stages=3,
    )
    if num_splits > 1:
        _combine_splits_kernel.on(device)[(num_tokens, num_heads)](
            out,
            partial_out,
            partial_lse,
            HEAD_DIM=head_dim,
            HEAD_DIM_PAD=tiles.head_dim_pad,
            NUM_SPLITS=num_splits,
            SPLITS_PAD=triton.next_power_of_2(num_splits),
        )
    return out
