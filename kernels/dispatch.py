"""The public entry points: check the arguments, then run Triton or the torch path.

Which backend runs (``backend=``):

- ``"auto"`` (default): Triton for GPU tensors. For CPU tensors, the vectorised torch path
  (``kernels.torch_path``), unless ``TRITON_INTERPRET=1`` is set in the environment at call
  time, in which case Triton's interpreter runs the kernels, as Triton users expect.
- ``"triton"``: the Triton kernels, on any device; CPU tensors run in the interpreter. This is
  how the tests exercise the kernels on a machine without a GPU.
- ``"torch"``: the torch path, on any device.

Why the interpreter is picked per call and per device rather than by importing under
``TRITON_INTERPRET=1``: the kernels are held compiled and interpreted at once
(``kernels.jit``), so one process can test the Triton kernels on the CPU while an engine in the
same process keeps the fast torch path, whichever was imported first. Triton itself is imported
only when a Triton backend is first used, so ``import kernels`` stays cheap.

Every entry point validates its arguments (``kernels.checks``) before any launch: bad input is
a ``ValueError`` naming the argument, never a crash or garbage.
"""

import importlib
import os

import torch

from kernels import checks, quant, torch_path

BACKENDS = ("auto", "triton", "torch")


def resolve_backend(backend: str, device: torch.device) -> str:
    """``"triton"`` or ``"torch"``: what ``backend`` means for tensors on ``device``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        return backend
    if device.type == "cuda" or (device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"):
        return "triton"
    return "torch"


def _implementation(backend: str, device: torch.device, triton_module: str, name: str):
    """The function ``name`` of the chosen backend; Triton modules are imported on first use."""
    if resolve_backend(backend, device) == "triton":
        return getattr(importlib.import_module(f"kernels.{triton_module}"), name)
    return getattr(torch_path, name)


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    backend: str = "auto",
    validate: bool = True,
) -> torch.Tensor:
    """Attention of a mixed batch (decode, prefill, chunked prefill) over a paged KV cache.

    Args:
        query: ``[num_query_tokens, num_heads, head_dim]``, float32, float16 or bfloat16.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``,
            contiguous, the query's dtype, or a quantized format with ``k_scale``/``v_scale``
            (``kernels.quant``): int8, fp8 (``torch.float8_e4m3fn``) or int4 (``torch.uint8``,
            ``head_dim // 2`` bytes a head).
        block_table: int32 ``[num_seqs, max_blocks_per_seq]``; entries past a sequence's
            last block are never read.
        seq_lens: int32 ``[num_seqs]``, each sequence's context length after this step.
        query_start_loc: int32 ``[num_seqs + 1]``, cumulative query lengths. The new tokens of
            sequence ``i`` are at positions ``seq_lens[i] - q_len ... seq_lens[i] - 1`` and
            attend causally to all positions before them.
        scale: softmax scale, usually ``head_dim ** -0.5``.
        out: optional ``[num_query_tokens, num_heads, head_dim]`` output, the query's dtype.
        k_scale, v_scale: float32, only for a quantized cache: ``[num_blocks, block_size,
            num_kv_heads]`` (int8), ``[1]`` or ``[num_kv_heads]`` (fp8), ``[num_blocks, block_size,
            num_kv_heads, head_dim // group_size]`` (int4).
        backend: ``"auto"``, ``"triton"`` or ``"torch"`` (see the module docstring).
        validate: check the arguments first (the default). The checks read the metadata back to
            the host, a device synchronisation on a GPU: a caller running many layers over the
            same metadata and caches of one shape checks the first layer and passes False after.

    Returns:
        ``out``, or a new tensor shaped and typed like ``query``.
    """
    if validate:
        checks.check_paged_attention(
            query, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale, out, k_scale, v_scale
        )
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    run = _implementation(backend, query.device, "attention", "paged_attention")
    return run(query, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale, out, k_scale, v_scale)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    backend: str = "auto",
    validate: bool = True,
) -> None:
    """Store each token's K/V in its slot: ``key[t]`` goes to slot ``slot_mapping[t]``.

    Slot ``s`` is offset ``s % block_size`` of block ``s // block_size``; -1 skips the token.
    ``key``/``value`` are ``[num_tokens, num_kv_heads, head_dim]`` in the cache's dtype, or any
    float dtype for a quantized cache: int8 and int4 write their per-token scales to
    ``k_scale``/``v_scale``, fp8 reads its static ones from there.
    ``slot_mapping`` may be int32 or int64. ``validate``: as for ``paged_attention``.
    """
    if validate:
        checks.check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)
    run = _implementation(backend, key.device, "cache_ops", "reshape_and_cache")
    run(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)


def copy_blocks(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    backend: str = "auto",
) -> None:
    """Copy-on-write: for each ``(src, dst)`` row of ``block_mapping`` (int32/int64 ``[num_pairs, 2]``),
    overwrite block ``dst`` with block ``src`` in both caches (and their per-token scales, int8 and int4).

    Destinations must be distinct and must not also be sources, so the result does not depend
    on the order of the copies.
    """
    checks.check_copy_blocks(key_cache, value_cache, block_mapping, k_scale, v_scale)
    per_token_scales = key_cache.dtype != quant.FP8_DTYPE  # an fp8 scale belongs to the tensor, not a block
    caches = [key_cache, value_cache, *((k_scale, v_scale) if k_scale is not None and per_token_scales else ())]
    run = _implementation(backend, key_cache.device, "cache_ops", "copy_blocks")
    run(caches, block_mapping)
