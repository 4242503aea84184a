"""What an engine is built from: the model, the memory given to the KV cache, and the scheduler's knobs.

The scheduler's knobs keep vLLM's names and are passed through to the core's `CacheConfig` and
`SchedulerConfig`, which validate them; this file checks only what the engine adds (dtype,
device, memory budgets) and fills the defaults that depend on the model.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from paged.core.policies import Policy
from paged.core.validation import is_int, is_number, is_power_of_two, require

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KV_CACHE_DTYPES = ("auto", "fp16", "int8", "fp8", "int4")  # how K/V are stored: paged.engine.cache_engine
# paged.engine.swap_compression.CODECS, named here so that a config does not import lz4 (an optional extra)
SWAP_COMPRESSIONS = (None, "lz4", "lz4-shuffle")
DEFAULT_CPU_KV_CACHE_BYTES = 256 << 20  # ~5.8k tokens of SmolLM2-135M in float32 (allocated and zeroed at start)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
DEFAULT_MAX_NUM_SEQS = 256


def default_threads() -> int:
    """Half the CPUs this process may run on, at least one (see EngineConfig.threads)."""
    return max(1, len(os.sched_getaffinity(0)) // 2)


@dataclass(slots=True)
class EngineConfig:
    """`model`: a Hugging Face folder, a .gguf file, or a known name (`smollm2-135m`).

    KV memory: `kv_cache_memory_bytes` on CPU, `gpu_memory_utilization` (the fraction of the GPU
    the engine may fill, weights included) on CUDA; `num_gpu_blocks` overrides both (tests use it
    to force preemption). Swapping needs a host pool: `swap_space` GiB or `num_cpu_blocks`; with
    preemption_mode="swap" and neither given, the host pool matches the device pool.

    `kv_cache_dtype`: "auto" (the model's dtype), "fp16", "int8", "fp8" or "int4" (see
    `paged.engine.cache_engine`); the same memory then holds as many more tokens as the format
    saves bytes. `swap_compression` ("lz4", "lz4-shuffle"): swapped blocks are held LZ4-compressed
    in host memory (`paged.engine.swap_compression`).

    `max_model_len` defaults to what both the model and the KV cache hold. Given larger than the
    model's maximum, it is an error. Given larger than the cache (tests do, to force preemption),
    it is kept with a warning (`KVCacheTooSmall`), and no sequence grows past the cache: its output
    ends there with finish_reason "length". (vLLM refuses to start then, and so does `paged serve`.)
    """

    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    block_size: int = 16
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks: int | None = None
    swap_space: float = 0.0
    num_cpu_blocks: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    policy: str | Policy = "fcfs"
    preemption_mode: str = "recompute"
    watermark: float = 0.01
    threads: int | None = None
    kv_cache_dtype: str = "auto"
    swap_compression: str | None = None

    def __post_init__(self) -> None:
        # Checked before the model loads (which takes seconds), and before any division by them.
        require(self.dtype == "auto" or self.dtype in DTYPES, "EngineConfig",
                "dtype", self.dtype, f"'auto' or one of {list(DTYPES)}")
        require(self.kv_cache_dtype in KV_CACHE_DTYPES, "EngineConfig", "kv_cache_dtype", self.kv_cache_dtype,
                f"one of {list(KV_CACHE_DTYPES)}")
        require(self.swap_compression in SWAP_COMPRESSIONS, "EngineConfig", "swap_compression",
                self.swap_compression, f"one of {list(SWAP_COMPRESSIONS)}")
        require(isinstance(self.device, str) and (self.device in ("auto", "cpu") or self.device.startswith("cuda")),
                 "EngineConfig", "device", self.device, "'auto', 'cpu' or 'cuda[:N]'")
        if isinstance(self.device, str) and self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"EngineConfig.device={self.device!r}: this torch build or machine has no CUDA device; "
                             "use 'cpu' or 'auto'")
        bs = self.block_size
        require(is_power_of_two(bs), "EngineConfig", "block_size", bs, "a power of two >= 1")
        require(self.kv_cache_memory_bytes is None or (is_int(self.kv_cache_memory_bytes)
                                                        and self.kv_cache_memory_bytes > 0), "EngineConfig",
                 "kv_cache_memory_bytes", self.kv_cache_memory_bytes, "a positive integer number of bytes")
        require(is_number(self.gpu_memory_utilization) and 0.0 < self.gpu_memory_utilization <= 1.0, "EngineConfig",
                 "gpu_memory_utilization", self.gpu_memory_utilization, "a fraction in (0, 1]")
        require(is_number(self.swap_space) and self.swap_space >= 0, "EngineConfig",
                "swap_space", self.swap_space, "GiB >= 0")
        require(self.num_gpu_blocks is None or (is_int(self.num_gpu_blocks) and self.num_gpu_blocks >= 1),
                 "EngineConfig", "num_gpu_blocks", self.num_gpu_blocks, "an integer >= 1")
        require(self.num_cpu_blocks is None or (is_int(self.num_cpu_blocks) and self.num_cpu_blocks >= 0),
                 "EngineConfig", "num_cpu_blocks", self.num_cpu_blocks, "an integer >= 0")
        # None means "the default"; 0 is a mistake, not a request for the default.
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "threads"):
            v = getattr(self, name)
            require(v is None or (is_int(v) and v >= 1), "EngineConfig", name, v, "None or an integer >= 1")

    def num_threads(self) -> int:
        return self.threads if self.threads is not None else default_threads()

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self, device: torch.device) -> torch.dtype:
        """float32 on CPU (fast there, and exact against references); bfloat16 on GPUs that have it."""
        if self.dtype != "auto":
            return DTYPES[self.dtype]
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
