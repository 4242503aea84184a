"""The oracle: paged attention and cache writes done the slow, obvious way.

Every fast path in this package is tested against these functions, so they are written to be
read, not to be quick: Python loops walk the block table one token at a time, each sequence gets
its own dense float32 attention with an explicit causal mask, and nothing is shared with the
kernels (no gather helpers, no masks built elsewhere). If a kernel and this file disagree, this
file is the one to believe.

Layouts are vLLM's: caches ``[num_blocks, block_size, num_kv_heads, head_dim]``, a sequence's
token ``t`` lives in block ``block_table[seq, t // block_size]`` at offset ``t % block_size``,
and slot ``s`` is offset ``s % block_size`` of block ``s // block_size``. Quantized caches (see
``kernels.quant``) are read here by their definitions, written out again rather than imported:
int8 with one float32 scale per token and KV head (``[num_blocks, block_size, num_kv_heads]``);
fp8 (e4m3) with one scale per tensor or KV head; int4 as uint8 bytes holding channel ``2j`` in the
low nibble and ``2j + 1`` in the high one, each plus 8, with a scale per group of channels.
"""

import torch


def _token_kv(cache: torch.Tensor, cache_scale: torch.Tensor | None, block_id: int, offset: int):
    """One token's K or V for all KV heads, as float32 ``[num_kv_heads, head_dim]``."""
    stored = cache[block_id, offset]
    if cache.dtype == torch.uint8:  # int4
        scales = cache_scale[block_id, offset]  # [num_kv_heads, num_groups]
        num_kv_heads, packed_dim = stored.shape
        group_size = 2 * packed_dim // scales.shape[1]
        values = torch.empty(num_kv_heads, 2 * packed_dim)
        for head in range(num_kv_heads):
            for j in range(packed_dim):
                byte = int(stored[head, j])
                for channel, nibble in ((2 * j, byte % 16), (2 * j + 1, byte // 16)):
                    values[head, channel] = (nibble - 8) * float(scales[head, channel // group_size])
        return values
    values = stored.float()
    if cache.dtype == torch.float8_e4m3fn:  # one scale per tensor ([1]) or per KV head
        return values * cache_scale.float().expand(values.shape[0])[:, None]
    if cache_scale is not None:  # int8
        values = values * cache_scale[block_id, offset].float()[:, None]
    return values


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of each new token over its sequence's paged context; float32 ``[num_tokens, heads, dim]``.

    The new tokens of sequence ``i`` sit at positions ``seq_lens[i] - q_len ... seq_lens[i] - 1``;
    the token at position ``p`` sees keys ``0 ... p``. Query head ``h`` reads KV head
    ``h // (num_heads // num_kv_heads)`` (grouped-query attention).
    """
    num_tokens, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    queries_per_kv = num_heads // num_kv_heads
    out = torch.zeros(num_tokens, num_heads, head_dim, dtype=torch.float32)
    starts = query_start_loc.tolist()
    for seq, seq_len in enumerate(seq_lens.tolist()):
        q_start, q_end = starts[seq], starts[seq + 1]
        if q_start == q_end:
            continue
        keys, values = [], []
        for position in range(seq_len):
            block_id = int(block_table[seq, position // block_size])
            offset = position % block_size
            keys.append(_token_kv(key_cache, k_scale, block_id, offset))
            values.append(_token_kv(value_cache, v_scale, block_id, offset))
        keys = torch.stack(keys)  # [seq_len, num_kv_heads, head_dim]
        values = torch.stack(values)
        q_len = q_end - q_start
        query_positions = torch.arange(seq_len - q_len, seq_len)
        key_positions = torch.arange(seq_len)
        visible = key_positions[None, :] <= query_positions[:, None]  # [q_len, seq_len]
        for head in range(num_heads):
            kv_head = head // queries_per_kv
            q = query[q_start:q_end, head].float()
            scores = (q @ keys[:, kv_head].T) * scale
            scores = scores.masked_fill(~visible, float("-inf"))
            weights = torch.softmax(scores, dim=-1)
            out[q_start:q_end, head] = weights @ values[:, kv_head]
    return out


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write token ``t``'s K/V into slot ``slot_mapping[t]``; slot -1 means "do not store"."""
    block_size = key_cache.shape[1]
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot == -1:
            continue
        key_cache[slot // block_size, slot % block_size] = key[token]
        value_cache[slot // block_size, slot % block_size] = value[token]


def copy_blocks(caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """For each ``(src, dst)`` row of ``block_mapping``, copy block ``src`` over block ``dst`` in every cache."""
    for src, dst in block_mapping.tolist():
        for cache in caches:
            cache[dst] = cache[src]
