"""The shared paged-KV core: block pool, prefix cache, KV manager, scheduler, policies.

Pure Python (no torch, no simpy, no clock): the simulator and the engine drive these same
classes through the contract in `scheduler.py`.
"""
from .block_pool import Block, BlockPool
from .block_table import BlockTable
from .config import CacheConfig, SchedulerConfig
from .kv_cache import KVCacheManager
from .metrics import SchedulerStats
from .outputs import SchedulerOutput
from .policies import POLICIES, Policy, make_policy
from .request import Request, RequestStatus, SamplingParams
from .scheduler import Scheduler

__all__ = [
    "Block", "BlockPool", "BlockTable", "CacheConfig", "SchedulerConfig", "KVCacheManager", "SchedulerStats",
    "SchedulerOutput", "POLICIES", "Policy", "make_policy", "Request", "RequestStatus", "SamplingParams",
    "Scheduler",
]
