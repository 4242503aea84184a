"""Validated configuration of the KV cache and the scheduler.

Bad values raise `ValueError` naming the field, the value and what was expected, at
construction, so a typo in a sweep fails at once instead of producing a strange result.
"""
from __future__ import annotations

from dataclasses import dataclass

from .policies import POLICIES, Policy
from .validation import is_int, is_number, is_power_of_two, require

PREEMPTION_MODES = ("recompute", "swap")
EVICTIONS = ("lru", "queue")


@dataclass(slots=True)
class CacheConfig:
    """How the KV cache is cut into blocks.

    `num_gpu_blocks` is the device pool the scheduler allocates from; `num_cpu_blocks` is the
    host pool that preemption by swap moves blocks into (0 disables swapping). `watermark`
    is the fraction of device blocks kept free at admission so that running requests can
    grow a little before anyone has to be preempted.

    `eviction` orders the eviction of free cached blocks: "lru" (vLLM's: least recently freed
    first, a request's blocks tail first) or "queue" (`paged.core.queue_aware_pool`: those no
    waiting prompt would hit first, then the ones the queue needs last; it needs a static queue
    order). Under "queue", `queue_reserve` is the fraction of device blocks that admission leaves
    to those the queue would hit: the queue's head waits, as for the watermark, rather than evict
    what the requests behind it will hit (0: the eviction order alone).
    """

    num_gpu_blocks: int
    block_size: int = 16
    num_cpu_blocks: int = 0
    enable_prefix_caching: bool = True
    watermark: float = 0.01
    eviction: str = "lru"
    queue_reserve: float = 0.0

    def __post_init__(self) -> None:
        bs = self.block_size
        require(is_power_of_two(bs),
                 "CacheConfig", "block_size", bs, "a power of two >= 1")
        require(is_int(self.num_gpu_blocks) and self.num_gpu_blocks > 0,
                 "CacheConfig", "num_gpu_blocks", self.num_gpu_blocks, "an integer >= 1")
        require(is_int(self.num_cpu_blocks) and self.num_cpu_blocks >= 0,
                 "CacheConfig", "num_cpu_blocks", self.num_cpu_blocks, "an integer >= 0")
        require(is_number(self.watermark) and 0.0 <= self.watermark < 1.0,
                 "CacheConfig", "watermark", self.watermark, "a value in [0, 1)")
        require(self.eviction in EVICTIONS, "CacheConfig", "eviction", self.eviction, f"one of {list(EVICTIONS)}")
        require(is_number(self.queue_reserve) and 0.0 <= self.queue_reserve < 1.0
                and (self.queue_reserve == 0.0 or self.eviction == "queue"),
                "CacheConfig", "queue_reserve", self.queue_reserve, 'a value in [0, 1), 0 unless eviction="queue"')

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.num_gpu_blocks)

    @property
    def queue_reserve_blocks(self) -> int:
        return int(self.queue_reserve * self.num_gpu_blocks)

    @property
    def num_gpu_slots(self) -> int:
        return self.num_gpu_blocks * self.block_size


@dataclass(slots=True)
class SchedulerConfig:
    """The knobs of the continuous-batching scheduler, named as in vLLM.

    `long_prefill_token_threshold` caps the chunk any one prompt may take in a step (0: no cap),
    so that one long prompt cannot take the whole token budget from the others.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: str | Policy = "fcfs"
    preemption_mode: str = "recompute"

    def __post_init__(self) -> None:

        require(is_int(self.max_num_seqs) and self.max_num_seqs >= 1,
                 "SchedulerConfig", "max_num_seqs", self.max_num_seqs, "an integer >= 1")
        require(is_int(self.max_model_len) and self.max_model_len >= 1,
                 "SchedulerConfig", "max_model_len", self.max_model_len, "an integer >= 1")
        # Every running sequence decodes one token a step, so the budget must cover them all.
        require(is_int(self.max_num_batched_tokens)
                 and self.max_num_batched_tokens >= self.max_num_seqs,
                 "SchedulerConfig", "max_num_batched_tokens", self.max_num_batched_tokens,
                 f">= max_num_seqs ({self.max_num_seqs})")
        if not self.enable_chunked_prefill:
            # Without chunking a whole prompt must fit in one step's budget.
            require(self.max_num_batched_tokens >= self.max_model_len,
                     "SchedulerConfig", "max_num_batched_tokens", self.max_num_batched_tokens,
                     f">= max_model_len ({self.max_model_len}) when chunked prefill is disabled")
        require(is_int(self.long_prefill_token_threshold) and self.long_prefill_token_threshold >= 0,
                 "SchedulerConfig", "long_prefill_token_threshold", self.long_prefill_token_threshold,
                 "an integer >= 0 (0 = no cap)")
        require(isinstance(self.policy, Policy) or self.policy in POLICIES, "SchedulerConfig", "policy",
                 self.policy, f"one of {sorted(POLICIES)} or a Policy instance")
        require(self.preemption_mode in PREEMPTION_MODES, "SchedulerConfig", "preemption_mode",
                 self.preemption_mode, f"one of {list(PREEMPTION_MODES)}")

    def check_block_size(self, block_size: int) -> None:
        """A budget below one block cannot make progress on a fresh block; refuse it up front."""
        require(self.max_num_batched_tokens >= block_size, "SchedulerConfig", "max_num_batched_tokens",
                 self.max_num_batched_tokens, f">= block_size ({block_size})")
