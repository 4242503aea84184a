"""Paged attention and cache writes in vectorised torch: the backend for machines without a GPU.

Why it exists beside the Triton kernels: on a plain CPU, Triton only runs through its interpreter,
which is far too slow for an engine, so the engine's hot path there is this file. It is not the
oracle either: it gathers K/V for many sequences at once with one indexing operation and hands
the math to ``scaled_dot_product_attention``, where the oracle walks tokens one by one.

Decode tokens (one query token per sequence) are batched, but not all in one padded tensor: a
batch's contexts differ (requests joined at different times), and padding every context to the
longest one made the step pay for the longest context times the batch size, plus the zeroing of
the padding. The decodes are sorted by context length and cut into groups of similar lengths
(``decode_groups``); each group is gathered into one ``[group, longest, kv_heads, head_dim]``
tensor and attended in one call. A group of equal lengths (requests that started together, and
every group of one) needs no padding, no zeroing and no mask at all. Longer queries (prefill,
chunked prefill) are attended one sequence at a time with a causal mask offset by the cached
context, so one long prompt never pads a whole batch.
"""

import torch
import torch.nn.functional as F

from kernels import quant

# A decode joins the group of a longer one when padding it to that length wastes at most PAD_SLACK
# positions or PAD_FRACTION of the longer context, whichever is more: another group costs a few
# torch calls, about what attending to PAD_SLACK more positions costs, and padding beyond that is
# waste. Measured (SmolLM2-135M shapes, one thread, random batches of 2-16 decodes with contexts
# spread around means of 32-320): 0.72 of the time of one padded group, the best of the bounds tried
# (0.89 with a group per distinct length, 0.74-0.82 for slacks of 16-128 and fractions of 0-0.5).
PAD_SLACK = 64
PAD_FRACTION = 0.25
# A group's gathered K (and V) stays within GROUP_BYTES (float32), unless one sequence alone is
# longer. Why: glibc's malloc serves a block larger than any it has lately freed with fresh pages
# from the kernel, whose page faults cost several times the copy into them. Measured on SmolLM2-135M
# (one thread), a whole decode step of 16 sequences of 320 tokens takes 249 ms in one group of 3.8 MiB
# tensors and 134 ms in groups of 1.5 MiB; 16 x 1024 tokens, 559 vs 183 ms.
GROUP_BYTES = 3 << 19


def decode_groups(lens: list[int], max_positions: int) -> list[tuple[int, int]]:
    """Cut contexts sorted longest first into runs ``[first, last)`` padded to their first (longest)
    length: each sequence wastes at most ``max(PAD_SLACK, PAD_FRACTION * longest)`` positions, and a
    group of more than one holds at most ``max_positions`` positions, padding included."""
    groups: list[tuple[int, int]] = []
    first = 0
    for i in range(1, len(lens) + 1):
        if (i == len(lens) or lens[first] - lens[i] > max(PAD_SLACK, PAD_FRACTION * lens[first])
                or (i + 1 - first) * lens[first] > max_positions):
            groups.append((first, i))
            first = i
    return groups


def _gather(cache, cache_scale, block_ids, length, past):
    """K or V of positions ``0 .. length-1`` of sequences whose blocks are ``block_ids [n, num_blocks]``,
    float32 ``[n, length, kv_heads, dim]``.

    Whole blocks are gathered (one ``index_select`` of contiguous blocks, several times faster than
    gathering token by token), then cut to ``length``. ``past`` (bool ``[n, length]``, or None when
    no sequence is shorter than ``length``) marks positions past a sequence's end: they are zeroed,
    since an unused slot may hold NaN, which a mask alone would let through (NaN * 0 is NaN).
    """
    num_seqs, num_blocks = block_ids.shape
    flat = block_ids.flatten().long()

    def gather_blocks(x):
        return x.index_select(0, flat).view(num_seqs, num_blocks * x.shape[1], *x.shape[2:])[:, :length]

    if cache_scale is None:
        values = gather_blocks(cache).float()
    elif cache.dtype == quant.FP8_DTYPE:
        values = quant.dequantize_fp8(gather_blocks(cache), cache_scale)
    elif cache.dtype == quant.INT4_DTYPE:
        values = quant.dequantize_int4(gather_blocks(cache), gather_blocks(cache_scale))
    else:
        values = quant.dequantize(gather_blocks(cache), gather_blocks(cache_scale))
    if past is not None:
        values[past.nonzero(as_tuple=True)] = 0.0
    return values


def _attend(query, keys, values, visible, scale):
    """``query [n, q_len, heads, dim]`` over ``keys/values [n, len, kv_heads, dim]`` -> ``[n, q_len, heads, dim]``;
    ``visible``: bool, broadcast to ``[n, 1, q_len, len]``, or None when every key is visible."""
    out = F.scaled_dot_product_attention(
        query.float().transpose(1, 2),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=visible,
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(1, 2)


def _attend_decodes(query, key_cache, value_cache, block_table, seq_lens, decodes, lens, starts, scale, out,
                    k_scale, v_scale):
    """Decode sequences ``decodes`` (one query token each), group by group (see the module docstring).

    The rows are sorted once, so that a group is a slice of each per-sequence tensor; the groups'
    results land in one buffer, written to ``out`` at the end."""
    device, (_, block_size, num_kv_heads, _), head_dim = query.device, key_cache.shape, query.shape[-1]
    order = sorted(decodes, key=lens.__getitem__, reverse=True)
    lengths = [lens[seq] for seq in order]
    rows = torch.tensor(order, device=device)
    tokens = torch.tensor([starts[seq] for seq in order], device=device)
    tables, sorted_lens = block_table[rows], seq_lens[rows]
    queries = query[tokens].unsqueeze(1)
    result = torch.empty(len(order), *query.shape[1:], device=device)
    for first, last in decode_groups(lengths, max(1, GROUP_BYTES // (4 * num_kv_heads * head_dim))):
        length = lengths[first]
        num_blocks = -(-length // block_size)
        block_ids, past, visible = tables[first:last, :num_blocks], None, None
        if lengths[last - 1] < length:  # ragged: blocks past a sequence's last are block 0, positions past it zeroed
            group_lens = sorted_lens[first:last, None]
            columns = torch.arange(num_blocks, device=device)
            block_ids = torch.where(columns < (group_lens + block_size - 1) // block_size, block_ids, 0)
            inside = torch.arange(length, device=device) < group_lens
            past, visible = ~inside, inside[:, None, None]
        keys = _gather(key_cache, k_scale, block_ids, length, past)
        values = _gather(value_cache, v_scale, block_ids, length, past)
        result[first:last] = _attend(queries[first:last], keys, values, visible, scale).squeeze(1)
    out[tokens] = result.to(out.dtype)


def _attend_prefill(query, key_cache, value_cache, block_table, seq, length, start, q_len, scale, out, k_scale,
                    v_scale):
    """The ``q_len`` new tokens of sequence ``seq`` (query rows from ``start``), causally over its ``length``."""
    device = query.device
    block_ids = block_table[seq : seq + 1, : -(-length // key_cache.shape[1])]
    keys = _gather(key_cache, k_scale, block_ids, length, None)
    values = _gather(value_cache, v_scale, block_ids, length, None)
    visible = torch.arange(length, device=device) <= torch.arange(length - q_len, length, device=device)[:, None]
    result = _attend(query[None, start : start + q_len], keys, values, visible, scale)
    out[start : start + q_len] = result[0].to(out.dtype)


def paged_attention(
    query, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale, out, k_scale, v_scale
):
    """Same contract as ``kernels.dispatch.paged_attention``; inputs already checked."""
    starts, q_lens, lens = query_start_loc.tolist(), query_start_loc.diff().tolist(), seq_lens.tolist()
    decodes = [seq for seq, q_len in enumerate(q_lens) if q_len == 1]
    if decodes:
        _attend_decodes(query, key_cache, value_cache, block_table, seq_lens, decodes, lens, starts, scale, out,
                        k_scale, v_scale)
    for seq, q_len in enumerate(q_lens):
        if q_len > 1:
            _attend_prefill(query, key_cache, value_cache, block_table, seq, lens[seq], starts[seq], q_len, scale, out,
                            k_scale, v_scale)
    return out


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale) -> None:
    """Same contract as ``kernels.dispatch.reshape_and_cache``; inputs already checked."""
    stored = slot_mapping >= 0
    slots = slot_mapping[stored].long()
    for new, cache, cache_scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        new = new[stored]
        if cache_scale is None:
            cache.flatten(0, 1)[slots] = new.to(cache.dtype)
        elif cache.dtype == quant.FP8_DTYPE:  # a static scale: only the values are written
            cache.flatten(0, 1)[slots] = quant.quantize_fp8(new, cache_scale)
        else:
            group_size = 2 * cache.shape[-1] // cache_scale.shape[-1] if cache.dtype == quant.INT4_DTYPE else None
            values, scales = quant.quantize(new) if group_size is None else quant.quantize_int4(new, group_size)
            cache.flatten(0, 1)[slots] = values
            cache_scale.flatten(0, 1)[slots] = scales


def copy_blocks(caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """Same contract as ``kernels.dispatch.copy_blocks``; inputs already checked."""
    src, dst = block_mapping[:, 0].long(), block_mapping[:, 1].long()
    for cache in caches:
        cache[dst] = cache[src]
