"""SimConfig: everything about a simulated deployment, as one validated dataclass.

The names follow vLLM's engine arguments where one exists (max_num_seqs, block_size,
gpu_memory_utilization, swap_space, kv_cache_dtype, preemption_mode), so that a setting can
be carried from the simulator to a real deployment unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from paged.core.policies import Policy
from paged.core.routing import DEFAULT_CACHE_THRESHOLD, ROUTERS
from paged.core.static_batching import RESERVE_MODES
from paged.core.validation import is_int, is_number, is_power_of_two, require

from .compressed_swap import CODECS as SWAP_CODECS
from .cost_model import CostModel

MIN_EFFICIENCY = 0.001
MAX_STEP_OVERHEAD_S = 60.0


@dataclass(slots=True)
class SimConfig:
    # the deployment
    model: str = "llama-2-7b"
    hardware: str = "a100-80gb"
    tp: int = 1
    replicas: int = 1
    router: str = "round_robin"
    # each request's time outside the engines, as a client sees it: HTTP and JSON, tokenization and
    # validation, the router's hop, the first streamed chunk's way back (vLLM's API server, the
    # "frontend" of its V1 engine). Charged between the request's arrival (its arrival_time, which
    # TTFT and E2E count from, as a client's clock does) and the moment the router and a replica's
    # scheduler see it; on a GPU it is ~ms, on a small CPU deployment a sizeable part of TTFT.
    frontend_latency_s: float = 0.0
    # kv_aware: how often the router reads the replicas' KV events (`paged router --kv-events-interval-s`,
    # 0.25 s there); it routes by what the last read showed (sim.kv_event_poll). 0: it sees each
    # event as it happens, as a router on a low-latency event stream (llm-d's over ZMQ) would.
    kv_events_interval_s: float = 0.0
    # prefix_aware: the match rate (prefix ids its record holds / the request's) at or below which a
    # request goes to the replica with the smallest record, not the best match (`paged router --cache-threshold`,
    # SGLang router's option of the same name)
    cache_threshold: float = DEFAULT_CACHE_THRESHOLD
    # the KV cache (num_gpu_blocks: None = what memory leaves; see sim.memory)
    block_size: int = 16
    kv_cache_dtype: str = "fp16"
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks: int | None = None
    swap_space_gib: float = 4.0  # host memory per GPU for preemption by swap
    # swapped blocks LZ4-compressed on the host ("lz4", "lz4-shuffle"), as measured in swap_profile
    # (see sim.compressed_swap), by swap_codec_threads cores per GPU; None: stored as they are
    swap_compression: str | None = None
    swap_profile: str | None = None  # None: sim.compressed_swap.DEFAULT_PROFILE
    swap_codec_threads: int = 1
    enable_prefix_caching: bool = True
    watermark: float = 0.01
    # which free cached blocks go first: "lru" (vLLM's) or "queue" (those the waiting queue needs
    # last, paged.core.queue_aware_pool), with up to queue_reserve of the blocks kept at admission
    # for those the queue would hit (CacheConfig)
    eviction: str = "lru"
    queue_reserve: float = 0.0
    # the scheduler (max_model_len: None = the model's context length)
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: str | Policy = "fcfs"
    priority_weights: tuple[float, float, float] | None = None  # (a, b, c) of the priority policy; None: its own
    preemption: str = "recompute"
    # the traditional baseline: fixed batches of static_batch_size, launched when full or after batch_timeout_s
    static_batching: bool = False
    static_batch_size: int = 8
    batch_timeout_s: float = 0.010
    # what a static batch reserves per request: "max_model_len" (a server that cannot know the
    # output length: the article's baseline) or "max_tokens" (prompt + the request's max_tokens,
    # which on a trace is its true output length: an oracle no real static server has)
    static_reserve: str = "max_model_len"
    # time: "calibrated", "vidur:DIR" (measured profiles), "roofline", a paged-step-profile/1 JSON, or a CostModel
    cost_model: str | CostModel = "calibrated"
    mfu_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    step_overhead_s: float = 0.002
    # the simulator itself
    fast_path: bool = True
    record_itl: bool = False  # keep every inter-token latency of every request (memory: 8 bytes a token)
    timeseries_interval_s: float | None = None  # None: about 1,000 samples over the trace
    progress: bool = False

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, expected: str) -> None:
            require(ok, "SimConfig", name, getattr(self, name), expected)

        check(is_int(self.tp) and self.tp >= 1, "tp", "an integer >= 1")
        check(is_int(self.replicas) and self.replicas >= 1, "replicas", "an integer >= 1")
        # checked here as well as by CacheConfig: the memory plan divides by it first
        bs = self.block_size
        check(is_power_of_two(bs), "block_size", "a power of two >= 1")
        check(self.router in ROUTERS, "router", f"one of {list(ROUTERS)}")
        check(is_number(self.frontend_latency_s) and 0 <= self.frontend_latency_s <= MAX_STEP_OVERHEAD_S,
              "frontend_latency_s", f"seconds in [0, {MAX_STEP_OVERHEAD_S}]")
        check(is_number(self.kv_events_interval_s) and 0 <= self.kv_events_interval_s <= MAX_STEP_OVERHEAD_S,
              "kv_events_interval_s", f"seconds in [0, {MAX_STEP_OVERHEAD_S}]")
        check(is_number(self.cache_threshold) and 0 <= self.cache_threshold <= 1, "cache_threshold",
              "a number in [0, 1]")
        check(self.num_gpu_blocks is None or (is_int(self.num_gpu_blocks) and self.num_gpu_blocks >= 1),
                "num_gpu_blocks", "None or an integer >= 1")
        check(self.swap_space_gib >= 0, "swap_space_gib", ">= 0")
        check(self.swap_compression in (None, *SWAP_CODECS), "swap_compression", f"None or one of {list(SWAP_CODECS)}")
        check(is_int(self.swap_codec_threads) and self.swap_codec_threads >= 1, "swap_codec_threads", "an integer >= 1")
        check(self.max_model_len is None or (is_int(self.max_model_len) and self.max_model_len >= 2),
                "max_model_len", "None or an integer >= 2")
        check(is_int(self.static_batch_size) and self.static_batch_size >= 1, "static_batch_size",
                "an integer >= 1")
        check(self.batch_timeout_s >= 0, "batch_timeout_s", ">= 0")
        # as StaticBatchScheduler checks, but here before a trace is read, and under the option's name
        check(not self.static_batching or self.static_batch_size <= self.max_num_seqs, "static_batch_size",
              f"at most max_num_seqs ({self.max_num_seqs}) with static_batching: every step runs the whole batch")
        w = self.priority_weights
        check(w is None or (self.policy == "priority" and len(w) == 3
                              and all(is_number(x) and math.isfinite(x) for x in w)),
                "priority_weights", "three finite numbers (a, b, c), with policy 'priority'")
        if w is not None:
            self.priority_weights = tuple(float(x) for x in w)  # plain floats, for the JSON record
        check(self.static_reserve in RESERVE_MODES, "static_reserve", f"one of {list(RESERVE_MODES)}")
        # Bounds that keep every step time a picosecond count the clock holds (sim.clock): no GPU
        # runs below 0.1% of its peak, and no step's fixed cost is a minute.
        check(MIN_EFFICIENCY <= self.mfu_efficiency <= 1, "mfu_efficiency", f"a value in [{MIN_EFFICIENCY}, 1]")
        check(MIN_EFFICIENCY <= self.bandwidth_efficiency <= 1, "bandwidth_efficiency",
              f"a value in [{MIN_EFFICIENCY}, 1]")
        check(0 <= self.step_overhead_s <= MAX_STEP_OVERHEAD_S, "step_overhead_s",
              f"seconds in [0, {MAX_STEP_OVERHEAD_S}]")
        check(self.timeseries_interval_s is None or self.timeseries_interval_s > 0, "timeseries_interval_s",
                "None or > 0")

    def to_dict(self) -> dict:
        """Plain values (for JSON output and sweep tables)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for k in ("policy", "cost_model"):
            if not isinstance(d[k], str):
                d[k] = getattr(d[k], "name", None) or type(d[k]).__name__
        return d

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
