"""Paged attention and cache writes in vectorised torch: the backend for machines without a GPU.

Why it exists beside the Triton kernels: on a plain CPU, Triton only runs through its interpreter,
which is far too slow for an engine, so the engine's hot path there is this file. It is not the
oracle either: it gathers K/V for many sequences at once with one indexing operation and hands
the math to ``scaled_dot_product_attention``, where the oracle walks tokens one by one.

Decode tokens (one query token per sequence) are batched: the contexts are gathered into a
padded ``[num_decodes, max_len, kv_heads, head_dim]`` tensor, and a length mask hides the
padding. Longer queries (prefill, chunked prefill) are attended one sequence at a time with a
causal mask offset by the cached context, so one long prompt never pads a whole batch.
"""

import torch
import torch.nn.functional as F

from kernels import quant


def _gather(cache, cache_scale, block_table, seq_lens, length):
    """K or V of positions ``0 .. length-1`` of each sequence, float32 ``[n, length, kv_heads, dim]``.

    Whole blocks are gathered (one ``index_select`` of contiguous blocks, several times faster than
    gathering token by token), then cut to ``length``. Positions at or past a sequence's length
    are zeroed: the block table may hold anything past a sequence's last block (those entries are
    replaced by block 0 before gathering), and an unused slot may hold NaN, which a mask alone
    would let through (NaN * 0 is NaN).
    """
    num_seqs, block_size = block_table.shape[0], cache.shape[1]
    num_blocks = -(-length // block_size)
    columns = torch.arange(num_blocks, device=cache.device)
    used = columns[None, :] < (seq_lens[:, None] + block_size - 1) // block_size
    block_ids = torch.where(used, block_table[:, :num_blocks], 0).flatten().long()

    def gather_blocks(x):
        return x.index_select(0, block_ids).view(num_seqs, num_blocks * block_size, *x.shape[2:])[:, :length]

    if cache_scale is None:
        values = gather_blocks(cache).float()
    else:
        values = quant.dequantize(gather_blocks(cache), gather_blocks(cache_scale))
    positions = torch.arange(length, device=cache.device)
    values[(positions[None, :] >= seq_lens[:, None]).nonzero(as_tuple=True)] = 0.0
    return values


def _attend(query, keys, values, query_positions, seq_lens, scale):
    """``query [n, q_len, heads, dim]`` over ``keys/values [n, len, kv_heads, dim]`` -> ``[n, q_len, heads, dim]``.

    Key ``k`` is visible to a query at position ``p`` when ``k <= p`` and ``k < seq_len``.
    """
    key_positions = torch.arange(keys.shape[1], device=keys.device)
    visible = (key_positions[None, None, :] <= query_positions[:, :, None]) & (
        key_positions[None, None, :] < seq_lens[:, None, None]
    )
    out = F.scaled_dot_product_attention(
        query.float().transpose(1, 2),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=visible[:, None],
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(1, 2)


def paged_attention(
    query, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale, out, k_scale, v_scale
):
    """Same contract as ``kernels.dispatch.paged_attention``; inputs already checked."""
    starts, q_lens, lens = query_start_loc.tolist(), query_start_loc.diff().tolist(), seq_lens.tolist()

    def attend(seqs: list[int], q_len: int) -> None:
        rows = torch.tensor(seqs, device=query.device)
        seq_len = seq_lens[rows]
        length = max(lens[seq] for seq in seqs)
        keys = _gather(key_cache, k_scale, block_table[rows], seq_len, length)
        values = _gather(value_cache, v_scale, block_table[rows], seq_len, length)
        tokens = torch.tensor(starts, device=query.device)[rows, None] + torch.arange(q_len, device=query.device)
        positions = seq_len[:, None] - q_len + torch.arange(q_len, device=query.device)
        result = _attend(query[tokens], keys, values, positions, seq_len, scale)
        out[tokens] = result.to(out.dtype)

    decodes = [seq for seq, q_len in enumerate(q_lens) if q_len == 1]
    if decodes:
        attend(decodes, 1)
    for seq, q_len in enumerate(q_lens):
        if q_len > 1:
            attend([seq], q_len)
    return out


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale) -> None:
    """Same contract as ``kernels.dispatch.reshape_and_cache``; inputs already checked."""
    stored = slot_mapping >= 0
    slots = slot_mapping[stored].long()
    for new, cache, cache_scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        new = new[stored]
        if cache_scale is None:
            cache.flatten(0, 1)[slots] = new
        else:
            values, scales = quant.quantize(new)
            cache.flatten(0, 1)[slots] = values
            cache_scale.flatten(0, 1)[slots] = scales


def copy_blocks(caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """Same contract as ``kernels.dispatch.copy_blocks``; inputs already checked."""
    src, dst = block_mapping[:, 0].long(), block_mapping[:, 1].long()
    for cache in caches:
        cache[dst] = cache[src]
