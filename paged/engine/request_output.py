"""What `generate` returns, in vLLM's shape: a `RequestOutput` per prompt with one
`CompletionOutput` per parallel sample, plus the request's timings.

Timings are `time.monotonic()` readings — the `now` the engine passed to the scheduler — so
a replay of timed arrivals can compare them with a simulator's clock after subtracting its start.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop", "length", "abort"; None while running
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float | None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission

    @property
    def ttft(self) -> float | None:
        """Time to first token, from arrival."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        """End-to-end latency, from arrival to the last sequence's finish."""
        return None if self.finished_time is None else self.finished_time - self.arrival_time


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics

    # The first (often only) sample, for the common n = 1 case.
    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason
