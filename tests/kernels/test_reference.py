"""The oracle itself, checked against attention computed without any paging."""

import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from kernels import reference


@st.composite
def dense_prompts(draw):
    """One prompt's K/V written into a shuffled paged cache, with the dense tensors kept."""
    block_size = draw(st.sampled_from([1, 3, 8]))
    seq_len = draw(st.integers(1, 20))
    num_kv_heads = draw(st.integers(1, 2))
    num_heads = num_kv_heads * draw(st.integers(1, 3))
    head_dim = draw(st.sampled_from([4, 8]))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    keys, values = (torch.randn(seq_len, num_kv_heads, head_dim, generator=generator) for _ in range(2))
    query = torch.randn(seq_len, num_heads, head_dim, generator=generator)
    num_blocks = -(-seq_len // block_size)
    block_ids = draw(st.permutations(range(num_blocks)))
    caches = [torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan")) for _ in range(2)]
    for position in range(seq_len):
        for cache, dense in zip(caches, (keys, values), strict=True):
            cache[block_ids[position // block_size], position % block_size] = dense[position]
    block_table = torch.tensor([block_ids], dtype=torch.int32)
    return query, keys, values, caches, block_table


@given(dense_prompts())
def test_prefill_equals_dense_causal_attention(prompt):
    query, keys, values, caches, block_table = prompt
    seq_len, _, head_dim = query.shape
    out = reference.paged_attention(
        query,
        *caches,
        block_table,
        torch.tensor([seq_len], dtype=torch.int32),
        torch.tensor([0, seq_len], dtype=torch.int32),
        head_dim**-0.5,
    )
    dense = F.scaled_dot_product_attention(
        query.transpose(0, 1)[None],
        keys.transpose(0, 1)[None],
        values.transpose(0, 1)[None],
        is_causal=True,
        enable_gqa=True,
    )[0].transpose(0, 1)
    torch.testing.assert_close(out, dense, atol=1e-5, rtol=1e-5)


@given(prompt=dense_prompts(), data=st.data())
def test_a_chunk_sees_what_the_whole_prompt_saw(prompt, data):
    """The last tokens as a chunk over cached context get exactly the rows of a full prefill."""
    query, _, _, caches, block_table = prompt
    seq_len, _, head_dim = query.shape
    chunk = data.draw(st.integers(1, seq_len))
    lengths = torch.tensor([seq_len], dtype=torch.int32)

    def attend(q):
        starts = torch.tensor([0, len(q)], dtype=torch.int32)
        return reference.paged_attention(q, *caches, block_table, lengths, starts, head_dim**-0.5)

    torch.testing.assert_close(attend(query[-chunk:]), attend(query)[-chunk:], atol=1e-6, rtol=1e-6)
