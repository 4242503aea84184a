"""Step statistics, named as vLLM names them where a name exists, with a Prometheus rendering.

Beyond vLLM's set: `fragmentation` (allocated slots not holding a token / allocated slots —
internal fragmentation of the last blocks), `kv_cache_tokens_perc` (slots holding a token /
all slots: the memory actually used, which static reservation inflates `kv_cache_usage_perc`
far above), `effective_batch_size` (sequences in the last step) and `queue_depth`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

# Prometheus kinds of vLLM's metrics; the rest are gauges under the same prefix.
_COUNTERS = {"prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "num_finished",
             "num_rejected", "num_aborted", "num_steps"}


@dataclass(slots=True)
class SchedulerStats:
    num_requests_running: int
    num_requests_waiting: int
    num_requests_swapped: int
    kv_cache_usage_perc: float
    kv_cache_tokens_perc: float
    fragmentation: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    num_finished: int
    num_rejected: int
    num_aborted: int
    num_steps: int
    effective_batch_size: int
    queue_depth: int

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    def to_prometheus(self, prefix: str = "vllm") -> str:
        lines = []
        for name, value in asdict(self).items():
            kind = "counter" if name in _COUNTERS else "gauge"
            metric = f"{prefix}:{name}" + ("_total" if kind == "counter" else "")
            lines += [f"# TYPE {metric} {kind}", f"{metric} {value}"]
        return "\n".join(lines) + "\n"
