"""Paged-attention kernels (Triton) with their oracle and a torch fallback for CPU-only machines.

Public API, vLLM's layouts and names:

- :func:`paged_attention` - attention of a mixed decode/prefill batch over a paged KV cache
- :func:`reshape_and_cache` - write new K/V into cache slots (optionally quantized: int8, fp8, int4)
- :func:`copy_blocks` - copy whole blocks, for copy-on-write
- :mod:`kernels.reference` - the naive oracle the fast paths are tested against

All three take ``backend="auto" | "triton" | "torch"`` (see :mod:`kernels.dispatch`), and
``k_scale=``/``v_scale=`` for a quantized cache (see :mod:`kernels.quant`).
"""

from kernels.dispatch import copy_blocks, paged_attention, reshape_and_cache

__all__ = ["copy_blocks", "paged_attention", "reshape_and_cache"]
