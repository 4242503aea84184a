"""How many KV blocks a replica has: what its GPUs hold once the weights are loaded.

As vLLM does it: `gpu_memory_utilization` of each GPU's memory is the budget, the weights
(split over the tensor-parallel group) come out of it, and the rest is cut into blocks of
`block_size` tokens. A quantized KV cache stores fewer bytes per token, hence more blocks.
Swap space (`swap_space_gib` of host memory per GPU, vLLM's default is 4) becomes the host
pool that preemption by swapping moves blocks into.
"""
from __future__ import annotations

from dataclasses import dataclass

from .hardware import HardwareSpec
from .models import ModelSpec


@dataclass(slots=True, frozen=True)
class KVPlan:
    num_gpu_blocks: int
    num_cpu_blocks: int
    block_bytes: float  # one block of the whole model (all tensor-parallel shards together)
    weight_bytes: int
    kv_bytes: float  # device memory left for the KV cache, all GPUs together


class DoesNotFit(ValueError):
    """The GPUs hold too little for the weights and one KV block: a deployment short of memory,
    told apart from one that cannot be built at all (a bad tp), as the config search reports them."""


def check_tp(model: ModelSpec, tp: int) -> None:
    """Tensor parallelism splits attention heads across GPUs (KV heads may be replicated instead)."""
    if tp < 1:
        raise ValueError(f"tp={tp}: expected an integer >= 1")
    if model.num_heads % tp or (model.num_kv_heads % tp and tp % model.num_kv_heads):
        raise ValueError(f"tp={tp}: {model.name} has {model.num_heads} attention heads and {model.num_kv_heads} "
                         "KV heads; expected tp to divide the heads, and to divide or be a multiple of the KV heads")


def plan_kv_cache(model: ModelSpec, hardware: HardwareSpec, *, tp: int = 1, gpu_memory_utilization: float = 0.9,
                  block_size: int = 16, kv_dtype: str = "fp16", swap_space_gib: float = 0.0) -> KVPlan:
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization={gpu_memory_utilization}: expected a value in (0, 1]")
    check_tp(model, tp)
    budget = gpu_memory_utilization * hardware.memory_bytes * tp
    weights = model.weight_bytes
    block_bytes = model.kv_bytes_per_token(kv_dtype) * block_size
    kv_bytes = budget - weights
    if kv_bytes < block_bytes:
        raise DoesNotFit(
            f"{model.name} does not fit on {tp} x {hardware.name}: its weights take {weights / 1e9:.1f} GB and one "
            f"KV block {block_bytes / 1e6:.1f} MB, but {gpu_memory_utilization} x {hardware.memory_gib:g} GiB x {tp} "
            f"GPU(s) gives {budget / 1e9:.1f} GB: short by {(weights + block_bytes - budget) / 1e9:.1f} GB "
            "(use a larger --tp, a larger GPU or a higher --gpu-memory-utilization)")
    return KVPlan(
        num_gpu_blocks=int(kv_bytes // block_bytes),
        num_cpu_blocks=int(swap_space_gib * 2**30 * tp // block_bytes),
        block_bytes=block_bytes,
        weight_bytes=weights,
        kv_bytes=kv_bytes,
    )
