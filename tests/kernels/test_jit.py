"""The compiled/interpreted kernel wrapper leaves Triton as it found it."""

import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

import kernels

PATCHED_BY_THE_INTERPRETER = (tl, tl.core, tl.math, tl.tensor, tl.dtype)


def snapshot():
    return {owner: dict(vars(owner)) for owner in PATCHED_BY_THE_INTERPRETER}


def test_interpreted_launch_leaves_triton_language_untouched():
    """Otherwise any kernel compiled later in the process fails (found the hard way)."""
    before, call_before = snapshot(), JITFunction.__call__
    q = torch.randn(3, 4, 16, dtype=torch.bfloat16)
    cache = torch.randn(4, 8, 2, 16, dtype=torch.bfloat16)
    table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    lens, starts = torch.tensor([10, 5], dtype=torch.int32), torch.tensor([0, 1, 3], dtype=torch.int32)
    kernels.paged_attention(q, cache, cache, table, lens, starts, 0.25, backend="triton")
    assert JITFunction.__call__ is call_before
    after = snapshot()
    for owner, attributes in before.items():
        changed = sorted(name for name, value in attributes.items() if after[owner].get(name) is not value)
        assert not changed, f"{owner.__name__}: {changed}"
