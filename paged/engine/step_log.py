"""The engine's steps as they ran: each one's shape (the cost model's features) and when its forward
pass started and ended.

Why: a step profile times the forward pass alone, on an engine with nothing else to do. A served
engine shares its process with the HTTP front end (the event loop that parses requests and writes
each token's SSE event) and its machine with the router and the clients, so its steps may take
longer than the profile's for the same shape, and the time between two forward passes (the
scheduler, the outputs, the hand-off between the event loop and the step's thread) is not in the
profile at all. The log shows both: the forward time of every shape the deployment ran, to hold
against the profile's, and the gaps between forward passes while the engine was busy. vLLM times
its iterations too (its scheduler stats); this keeps the shapes beside the times.

`StepLog` wraps the engine's runner (`install`); it keeps the last `capacity` steps, numbered, so a
reader can ask for the steps since the ones it has seen (`since`).
"""
from __future__ import annotations

import time
from collections import deque

from paged import KVCacheManager, SchedulerOutput

from .engine import LLMEngine
from .profile import FEATURES

DEFAULT_CAPACITY = 1 << 14


class StepLog:
    """The runner, wrapped: `execute_model` as before, and a row per step (empty steps too, which run no model)."""

    def __init__(self, runner, capacity: int = DEFAULT_CAPACITY) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"StepLog capacity={capacity!r}: expected a positive integer")
        self.runner = runner
        self.rows: deque[dict] = deque(maxlen=capacity)
        self.next_seq = 0  # the number the next step will get

    def execute_model(self, out: SchedulerOutput, kv: KVCacheManager) -> dict[str, list[int]]:
        start = time.monotonic()
        sampled = self.runner.execute_model(out, kv)
        end = time.monotonic()
        row = {name: getattr(out, name) for name in FEATURES}
        row.update(seq=self.next_seq, start_s=start, end_s=end, forward_s=end - start,
                   decode_max_context=max((r.num_computed_tokens + 1 for r in out.decode_requests), default=0))
        self.rows.append(row)
        self.next_seq += 1
        return sampled

    def since(self, seq: int = 0) -> dict:
        """The kept steps numbered `seq` or later (times on the engine's monotonic clock), and the next number."""
        if not isinstance(seq, int) or seq < 0:
            raise ValueError(f"steps since={seq!r}: expected an integer >= 0")
        rows = [r for r in self.rows if r["seq"] >= seq]
        return {"next": self.next_seq, "steps": rows}

    @classmethod
    def install(cls, engine: LLMEngine, capacity: int = DEFAULT_CAPACITY) -> StepLog:
        """Wrap `engine`'s runner (once: a second call returns the log already there)."""
        if isinstance(engine.runner, cls):
            return engine.runner
        engine.runner = log = cls(engine.runner, capacity)
        return log
