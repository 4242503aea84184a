"""`simulate(workload, config)`: build the replicas' schedulers, KV pools and cost model from a
SimConfig, replay the workload through them, and return a SimResult."""
from __future__ import annotations

import gc
import json
import math
import time
import warnings
from contextlib import contextmanager
from dataclasses import replace

import numpy as np

from paged.core.config import CacheConfig, SchedulerConfig
from paged.core.policies import Priority
from paged.core.routing import make_router
from paged.core.scheduler import Scheduler
from paged.core.static_batching import StaticBatchScheduler
from paged.workloads.workload import Workload

from .clock import TICKS_PER_S, Environment, to_ticks
from .cluster import Cluster
from .compressed_swap import DEFAULT_PROFILE, SwapProfile, with_compressed_swap
from .cost_model import CostModel, RooflineParams, roofline_cost_model
from .gpu_cost import gpu_cost_model, is_gpu_cost_model
from .hardware import get_hardware
from .host_memory import check_fits
from .memory import KVPlan, plan_kv_cache
from .models import get_model
from .recorder import TIMESERIES_COLUMNS, RequestLog
from .report import SimResult
from .sim_config import SimConfig
from .slo import SLO, SLOMissed, SLOWatch


def build_cost_model(config: SimConfig) -> CostModel:
    cm = config.cost_model
    if isinstance(cm, CostModel):
        model = cm
    elif is_gpu_cost_model(cm):
        model = gpu_cost_model(cm, config.model, config.hardware, tp=config.tp, kv_cache_dtype=config.kv_cache_dtype,
                               block_size=config.block_size, step_overhead_s=config.step_overhead_s)
    elif cm == "roofline":
        model = roofline_cost_model(config.model, config.hardware, tp=config.tp, kv_cache_dtype=config.kv_cache_dtype,
                                    block_size=config.block_size,
                                    params=RooflineParams(config.mfu_efficiency, config.bandwidth_efficiency,
                                                          config.step_overhead_s))
    else:
        from .profiled import fit_profile

        model = fit_profile(cm).cost_model
    profile = swap_profile(config)
    if profile is None:
        return model
    return with_compressed_swap(model, profile, kv_plan(config), get_hardware(config.hardware), config.tp,
                                config.swap_codec_threads)


def kv_plan(config: SimConfig) -> KVPlan:
    return plan_kv_cache(get_model(config.model), get_hardware(config.hardware), tp=config.tp,
                         gpu_memory_utilization=config.gpu_memory_utilization, block_size=config.block_size,
                         kv_dtype=config.kv_cache_dtype, swap_space_gib=config.swap_space_gib)


def swap_profile(config: SimConfig) -> SwapProfile | None:
    """The measured LZ4 profile of compressed swap, or None when swapped blocks are stored as they are."""
    if config.swap_compression is None:
        return None
    path = config.swap_profile or DEFAULT_PROFILE
    try:
        return SwapProfile.load(path, config.kv_cache_dtype, config.swap_compression)
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:  # SwapProfile's own ValueErrors name it
        raise ValueError(f"swap profile {path}: cannot read it ({type(e).__name__}: {e}); expected the JSON "
                         "python -m paged.engine.swap_profile writes") from None


def build_cache_config(config: SimConfig) -> CacheConfig:
    plan = kv_plan(config)
    swap_profile(config)  # a missing measurement is refused here, before any run
    return CacheConfig(
        num_gpu_blocks=config.num_gpu_blocks or plan.num_gpu_blocks,
        block_size=config.block_size,
        # Compressed or not, the swap space holds as many blocks (sim.compressed_swap: why).
        num_cpu_blocks=plan.num_cpu_blocks if config.preemption == "swap" else 0,
        enable_prefix_caching=config.enable_prefix_caching,
        watermark=config.watermark,
        eviction=config.eviction,
        queue_reserve=config.queue_reserve,
    )


def build_scheduler_config(config: SimConfig) -> SchedulerConfig:
    return SchedulerConfig(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.max_model_len or get_model(config.model).max_model_len,
        enable_chunked_prefill=config.enable_chunked_prefill,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        policy=config.policy if (w := config.priority_weights) is None else Priority(a=w[0], b=w[1], c=w[2]),
        preemption_mode=config.preemption,
    )


def make_scheduler(config: SimConfig, cache: CacheConfig, sched: SchedulerConfig):
    if not config.static_batching:
        s = Scheduler(cache, sched)
        s.list_decode_requests = False  # the simulator samples nothing: the step's counts say it all
        return s
    return StaticBatchScheduler(cache, sched, batch_size=config.static_batch_size,
                                batch_timeout_s=config.batch_timeout_s, reserve=config.static_reserve)


def sample_interval_s(workload: Workload) -> float:
    """About 1,000 samples over the arrivals, on a 1-2-5 grid, and at least 10 ms: a fast-path
    window never spans a sample, so samples much closer than steps would cut every window."""
    raw = max(float(workload.arrival_s[-1]) if len(workload) else 0.0, 1e-3) / 1000
    base = 10 ** math.floor(math.log10(raw))
    return max(0.01, next(m * base for m in (1, 2, 5, 10) if m * base >= raw))


def min_run_s(workload: Workload, config: SimConfig, cost: CostModel, cache: CacheConfig,
              sched: SchedulerConfig) -> float:
    """A lower bound of the run's length, for the memory check: the last arrival, each request
    that can run its arrival plus one step per output token, and each replica's share of all
    output tokens at max_num_seqs a step; no step is shorter than the cost model's intercept."""
    if not len(workload):
        return 0.0
    step_s = max(p[0] for p in cost.pieces) / TICKS_PER_S
    total = workload.num_prompt_tokens + workload.num_output_tokens
    reserved = np.full(len(workload), sched.max_model_len) if config.static_batching and \
        config.static_reserve == "max_model_len" else total
    runs = (total <= sched.max_model_len) & (reserved <= cache.num_gpu_slots)
    out = workload.num_output_tokens[runs]
    own = float((workload.arrival_s[runs] + out * step_s).max()) if len(out) else 0.0
    shared = float(out.sum()) / (config.replicas * sched.max_num_seqs) * step_s
    return max(float(workload.arrival_s[-1]), own, shared)


@contextmanager
def few_young_collections(threshold: int = 100_000):
    """Collect the youngest generation every `threshold` net container allocations instead of
    CPython's 700, then restore the setting. A run keeps thousands of requests, block tables and
    row tuples alive at once and makes almost no cyclic garbage (one full collection in an Azure
    conversation run frees ~400 objects), so the default collector traversed live objects ~60
    times per run for nothing: 4% of the simulation's time. Garbage is the same, only collected
    less often; the results cannot depend on it."""
    old = gc.get_threshold()
    gc.set_threshold(max(threshold, old[0]), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def simulate(workload: Workload, config: SimConfig | None = None, *, stop_on_miss: SLO | None = None,
             **overrides) -> SimResult:
    """Replay `workload` on the deployment `config` describes (keyword overrides change fields).
    With `stop_on_miss`, the run ends as soon as it cannot meet those SLOs (`sim.slo`): its
    summary then counts unfinished requests."""
    config = replace(config or SimConfig(), **overrides)
    start = time.perf_counter()
    cost = build_cost_model(config)
    cache, sched = build_cache_config(config), build_scheduler_config(config)
    interval = config.timeseries_interval_s or sample_interval_s(workload)
    max_samples = check_fits(cache.num_gpu_blocks, config.replicas,
                             min_run_s(workload, config, cost, cache, sched) if stop_on_miss is None
                             else float(workload.arrival_s[-1]) if len(workload) else 0.0, interval)
    schedulers = [make_scheduler(config, cache, sched) for _ in range(config.replicas)]
    router = make_router(config.router, config.replicas, None, config.block_size, workload.hash_id_block_size,
                         config.max_num_seqs, config.cache_threshold)
    env = Environment()
    frontend_latency_ticks = to_ticks(config.frontend_latency_s)
    log = RequestLog(len(workload), config.record_itl, frontend_latency_ticks)
    if stop_on_miss is not None:
        log.watch = SLOWatch(stop_on_miss, workload.num_output_tokens)
    progress = None
    if config.progress:
        from tqdm import tqdm

        progress = tqdm(total=len(workload), unit="req", desc="arrivals", mininterval=0.5)
    cluster = Cluster(env, workload, schedulers, cost, router, log, to_ticks(interval), max_samples, config.fast_path,
                      progress, frontend_latency_ticks, to_ticks(config.kv_events_interval_s))
    try:
        with few_young_collections():
            env.run()
    except SLOMissed:
        pass
    log.flush()
    end = env.now
    replicas = cluster.replicas
    for r in replicas:
        r.close(end)
    if progress is not None:
        progress.close()
    wall = time.perf_counter() - start
    coarsened = max(r.timeseries.coarsened for r in replicas)
    if coarsened:
        warnings.warn(f"the time series would have outgrown half of this machine's memory at one sample every "
                      f"{interval:g} s over the run's {end / TICKS_PER_S:,.4g} s: it keeps one every "
                      f"{interval * 2**coarsened:g} s instead (a larger --timeseries-interval-s avoids this)",
                      RuntimeWarning, stacklevel=2)

    ts = {c: [] for c in ("replica", *TIMESERIES_COLUMNS)}
    for r in replicas:
        cols = r.timeseries.columns()
        ts["replica"].append(np.full(len(cols["time_s"]), r.index, dtype=np.float64))
        for c in TIMESERIES_COLUMNS:
            ts[c].append(cols[c])
    ts = {c: np.concatenate(v) for c, v in ts.items()}
    ts["replica"] = ts["replica"].astype(np.int64)
    itl_hist: dict[int, int] = {}
    for r in replicas:
        for b, w in r.itl_hist.items():
            itl_hist[b] = itl_hist.get(b, 0) + w
    scheds = [r.scheduler for r in replicas]
    counters = {
        "num_steps": sum(s.num_steps for s in scheds),
        "num_scheduled_seqs": sum(s.num_scheduled_seqs for s in scheds),
        "num_preemptions": sum(s.num_preemptions for s in scheds),
        "prefix_cache_queries": sum(s.kv.prefix_cache_queries for s in scheds),
        "prefix_cache_hits": sum(s.kv.prefix_cache_hits for s in scheds),
        "peak_kv_usage": max(r.peak_used_blocks for r in replicas) / cache.num_gpu_blocks,
        "num_window_steps": sum(r.num_window_steps for r in replicas),
        "busy_s": sum(r.busy_ticks for r in replicas) / TICKS_PER_S,
        "num_windows": sum(r.num_windows for r in replicas),
    }
    return SimResult(config, workload, log, ts, counters, itl_hist, sum(r.itl_weighted_ticks for r in replicas),
                     end / TICKS_PER_S, wall, cache.num_gpu_blocks, scheds)
