"""Prometheus metrics under vLLM's names, plus the article's own under `paged:`.

Per app, in its own `CollectorRegistry` (never the process-global one), so a process (a test)
may build several apps. Two sources:

- per request, as the server streams it: prompt and generation tokens, successes by finish
  reason, and the latency histograms (TTFT, inter-token, end-to-end, queue time);
- the scheduler and block pool, read at scrape time between engine steps
  (`AsyncLLM.inspect`): requests running and waiting, KV usage, prefix-cache queries and hits,
  preemptions — and fragmentation, effective batch size, queue depth, block allocations and
  frees, aborted sequences (`paged:`), with failed HTTP requests by status
  (`paged:request_errors_total`).

And the KV cache's configuration as vLLM exports it: `vllm:cache_config_info`, a gauge set to 1
whose labels are the cache config's fields, values as Python prints them (`num_gpu_blocks="661"`,
`enable_prefix_caching="True"`), for the engine as built: a cache sized from a memory budget
shows the blocks it got. `paged router` reads `num_gpu_blocks` there (`paged.serve.backends`).
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from paged.engine import LLMEngine, RequestOutput

# vLLM's buckets
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)

# name, kind, help, how to read it from the snapshot
_SCHEDULER_METRICS = [
    ("vllm:num_requests_running", "gauge", "Requests in the running batch.", "num_requests_running"),
    ("vllm:num_requests_waiting", "gauge", "Requests waiting to be admitted.", "num_requests_waiting"),
    ("vllm:kv_cache_usage_perc", "gauge", "Fraction of KV blocks in use (1 = full).", "kv_cache_usage_perc"),
    ("vllm:prefix_cache_queries", "counter", "Prompt tokens looked up in the prefix cache.", "prefix_cache_queries"),
    ("vllm:prefix_cache_hits", "counter", "Prompt tokens found in the prefix cache.", "prefix_cache_hits"),
    ("vllm:num_preemptions", "counter", "Preemptions of running requests.", "num_preemptions"),
    ("paged:kv_cache_fragmentation", "gauge",
     "Allocated KV slots not holding a token / allocated slots (internal fragmentation).", "fragmentation"),
    ("paged:effective_batch_size", "gauge", "Sequences in the last engine step.", "effective_batch_size"),
    ("paged:queue_depth", "gauge", "Requests waiting or swapped out.", "queue_depth"),
    ("paged:block_allocations", "counter", "KV blocks taken off the free lists.", "block_allocations"),
    ("paged:block_frees", "counter", "KV blocks given back to the free lists.", "block_frees"),
    ("paged:aborted_requests", "counter", "Sequences aborted (clients gone, requests cancelled).", "num_aborted"),
]


def scheduler_snapshot(engine: LLMEngine) -> dict:
    """What the scrape reports about the scheduler; run between steps (AsyncLLM.inspect)."""
    stats = engine.scheduler.stats()
    pool = engine.scheduler.kv.pool
    return {"num_requests_running": stats.num_requests_running, "num_requests_waiting": stats.num_requests_waiting,
            "kv_cache_usage_perc": stats.kv_cache_usage_perc, "prefix_cache_queries": stats.prefix_cache_queries,
            "prefix_cache_hits": stats.prefix_cache_hits, "num_preemptions": stats.num_preemptions,
            "fragmentation": stats.fragmentation, "effective_batch_size": stats.effective_batch_size,
            "queue_depth": stats.queue_depth, "block_allocations": pool.num_allocations,
            "block_frees": pool.num_frees, "num_aborted": stats.num_aborted}


def cache_config_info(engine: LLMEngine) -> dict[str, str]:
    """The labels of `vllm:cache_config_info`, under vLLM's `CacheConfig` names (`cache_dtype` is the
    engine's `kv_cache_dtype`, `num_gpu_blocks_override` its `num_gpu_blocks` as given), plus the
    `engine` index vLLM adds (one engine a server here). `kv_cache_memory_bytes` is the budget the
    cache was sized from, default included (the option as given read "None" on every server left at
    the default), and absent when `num_gpu_blocks` sized it instead."""
    cache, config = engine.scheduler.cache_config, engine.config
    info = {"block_size": cache.block_size, "num_gpu_blocks": cache.num_gpu_blocks,
            "num_cpu_blocks": cache.num_cpu_blocks, "enable_prefix_caching": cache.enable_prefix_caching,
            "cache_dtype": config.kv_cache_dtype, "gpu_memory_utilization": config.gpu_memory_utilization,
            "kv_cache_memory_bytes": engine.kv_cache_memory_bytes, "swap_space": config.swap_space,
            "num_gpu_blocks_override": config.num_gpu_blocks, "engine": 0}
    if info["kv_cache_memory_bytes"] is None:
        del info["kv_cache_memory_bytes"]
    return {name: str(value) for name, value in info.items()}


class _SchedulerCollector:
    """Yields the last snapshot's values; the /metrics handler refreshes it before each scrape."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.snapshot: dict | None = None

    def collect(self):
        if self.snapshot is None:
            return
        for name, kind, help_, key in _SCHEDULER_METRICS:
            family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(name, help_,
                                                                                       labels=["model_name"])
            family.add_metric([self.model_name], self.snapshot[key])
            yield family


class ServerMetrics:
    def __init__(self, model_name: str, cache_info: dict[str, str]) -> None:
        """`cache_info`: the labels of `vllm:cache_config_info` (`cache_config_info`)."""
        self.registry = registry = CollectorRegistry()
        label = ["model_name"]
        self.model_name = model_name
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed.", label, registry=registry)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", label, registry=registry)
        self.request_success = Counter("vllm:request_success", "Finished requests by finish reason.",
                                       ["model_name", "finished_reason"], registry=registry)
        self.errors = Counter("paged:request_errors", "Requests answered with an HTTP error, by status.",
                              ["model_name", "status"], registry=registry)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", label,
                              buckets=TTFT_BUCKETS, registry=registry)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between successive output tokens.", label,
                             buckets=ITL_BUCKETS, registry=registry)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Arrival to last token.", label,
                             buckets=REQUEST_BUCKETS, registry=registry)
        self.queue_time = Histogram("vllm:request_queue_time_seconds", "Arrival to first scheduled.", label,
                                    buckets=REQUEST_BUCKETS, registry=registry)
        # a gauge, as vLLM's (prometheus-client's Info would expose the same name and labels)
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig.", list(cache_info),
              registry=registry).labels(**cache_info).set(1)
        self._scheduler = _SchedulerCollector(model_name)
        registry.register(self._scheduler)
        # The per-token paths use these children: looking a label up takes a lock and a dict lookup.
        self.per_model = {m: m.labels(model_name) for m in (self.prompt_tokens, self.generation_tokens, self.ttft,
                                                              self.itl, self.e2e, self.queue_time)}

    def render(self, snapshot: dict) -> bytes:
        self._scheduler.snapshot = snapshot
        return generate_latest(self.registry)

    def error(self, status: int) -> None:
        self.errors.labels(self.model_name, str(status)).inc()

    def tracker(self) -> RequestTracker:
        return RequestTracker(self)


class RequestTracker:
    """Follows one engine request's outputs as the server reads them."""

    __slots__ = ("metrics", "num_tokens", "last_time")

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.num_tokens = 0
        self.last_time = 0.0

    def observe(self, out: RequestOutput) -> None:
        m = self.metrics
        child = m.per_model
        now = time.monotonic()
        num_tokens = sum(len(c.token_ids) for c in out.outputs)
        new = num_tokens - self.num_tokens
        if new > 0:
            if self.num_tokens == 0:
                if out.metrics.ttft is not None:
                    child[m.ttft].observe(out.metrics.ttft)
            else:
                gap = (now - self.last_time) / new
                itl = child[m.itl]
                for _ in range(new):
                    itl.observe(gap)
            self.num_tokens, self.last_time = num_tokens, now
        if out.finished:
            child[m.prompt_tokens].inc(len(out.prompt_token_ids))
            child[m.generation_tokens].inc(num_tokens)
            for c in out.outputs:
                m.request_success.labels(m.model_name, c.finish_reason).inc()
            for histogram, value in ((m.e2e, out.metrics.e2e), (m.queue_time, out.metrics.queue_time)):
                if value is not None:
                    child[histogram].observe(value)
