"""paged: one paged-KV core, several drivers (see docs/architecture.md).

`paged.core` is pure Python (no torch, no simpy, no HTTP, no clock); `paged.engine` (torch)
and `paged.serve` (HTTP) drive it, and so does the simulator (`sim`). Importing `paged`
imports only the core; the public names below are the core's.
"""
from .core import (
    POLICIES,
    Block,
    BlockPool,
    BlockTable,
    CacheConfig,
    KVCacheManager,
    Policy,
    Request,
    RequestStatus,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    SchedulerStats,
    make_policy,
)

__all__ = [
    "Block", "BlockPool", "BlockTable", "CacheConfig", "SchedulerConfig", "KVCacheManager", "SchedulerStats",
    "SchedulerOutput", "POLICIES", "Policy", "make_policy", "Request", "RequestStatus", "SamplingParams",
    "Scheduler",
]
