"""DecodeBatch's block arithmetic for the fast path, against counting step by step."""
from hypothesis import given
from hypothesis import strategies as st

from paged.core.decode_batch import DecodeBatch
from paged.core.request import Request


@given(block_size=st.sampled_from([1, 2, 4, 16]),
       contexts=st.lists(st.integers(1, 100), max_size=40),
       clock=st.integers(0, 50),
       num_free_blocks=st.integers(0, 200),
       k_max=st.integers(0, 300))
def test_steps_with_blocks_is_the_most_steps_whose_blocks_fit(block_size, contexts, clock, num_free_blocks, k_max):
    batch = DecodeBatch(block_size)
    batch.clock = clock
    for i, c in enumerate(contexts):
        req = Request(str(i), num_prompt_tokens=c, max_tokens=10_000)
        req.num_computed_base = c
        batch.join(req)
    needs = batch.block_needs(k_max)
    expected = 0
    while expected < k_max and sum(needs[:expected + 1]) <= num_free_blocks:
        expected += 1
    assert batch.steps_with_blocks(num_free_blocks, k_max) == expected
