"""The shared core: block pool, prefix cache, KV manager, schedulers, policies, routing policies.

Pure Python: no torch, no simpy, no HTTP, no clock (time comes in as `now`). The simulator,
the engine and the load balancer drive these same classes; the contract they drive is
`paged.core.scheduler_base.BaseScheduler` (docs/architecture.md draws the layers).
"""
from .block_pool import Block, BlockPool
from .block_table import BlockTable
from .config import CacheConfig, SchedulerConfig
from .kv_cache import KVCacheManager
from .metrics import SchedulerStats
from .policies import POLICIES, Policy, make_policy
from .request import Request, RequestStatus, SamplingParams
from .scheduler import Scheduler
from .scheduler_output import SchedulerOutput

__all__ = [
    "Block", "BlockPool", "BlockTable", "CacheConfig", "SchedulerConfig", "KVCacheManager", "SchedulerStats",
    "SchedulerOutput", "POLICIES", "Policy", "make_policy", "Request", "RequestStatus", "SamplingParams",
    "Scheduler",
]
