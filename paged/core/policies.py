"""Queue orders. A policy is one small class: `key(request, kv)` sorts waiting requests (lower
is served first) and `victim_key(request)` picks whom to preempt (highest goes first).

`static_order` promises that keys do not change while requests wait, so the scheduler can keep
the waiting queue in a heap, and the simulator's fast path can rely on a blocked head staying
blocked; `arrivals_rank_last` promises more, that a request arriving later ranks after every
request already there (first come, first served). `preemptive` lets a waiting request preempt
running work of lower priority.
"""
from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from .request import Request

# (arrival_time, seq), computed in C: victim keys are read for every running request when one is
# picked, which a full pool does at many steps.
_ARRIVAL_ORDER = attrgetter("arrival_time", "seq")


@dataclass(slots=True)
class Policy:
    name = "base"
    static_order = True
    arrivals_rank_last = False
    preemptive: bool = False

    def key(self, request: Request, kv=None) -> tuple:
        raise NotImplementedError

    def victim_key(self, request: Request) -> tuple:
        """Fixed for as long as the request runs: the scheduler relies on it (`_pick_victim`)."""
        return self.key(request)

    def order(self, requests: list[Request], kv=None) -> list[Request]:
        """Queued requests, head first (used once per step when the order is dynamic)."""
        return sorted(requests, key=lambda r: self.key(r, kv))


@dataclass(slots=True)
class FCFS(Policy):
    """First come, first served: the oldest request first; the newest is preempted first."""

    name = "fcfs"
    arrivals_rank_last = True
    victim_key = staticmethod(_ARRIVAL_ORDER)

    def key(self, request, kv=None):
        return (request.arrival_time, request.seq)


@dataclass(slots=True)
class Priority(Policy):
    """The article's dynamic priority  P = a*wait_time + b*expected_latency + c*business_value.

    wait_time = now - arrival_time, so P - a*now is fixed per request: the order of two requests
    never changes while both wait, yet an old request overtakes newer ones of higher value
    (aging). expected_latency is the request's expected size in tokens (prompt + expected
    output). vLLM's integer `priority` (lower = more urgent) ranks first; P orders within it.
    A high-priority arrival may preempt lower-priority running work.
    """

    name = "priority"
    preemptive: bool = True
    a: float = 1.0
    b: float = 0.0
    c: float = 1.0

    def key(self, request, kv=None):
        expected = request.num_prompt_tokens + (request.expected_output_tokens or request.max_output_tokens)
        score = self.b * expected + self.c * request.business_value - self.a * request.arrival_time
        return (request.priority, -score, request.seq)


@dataclass(slots=True)
class SJF(Policy):
    """Shortest expected job first (prompt + expected output tokens)."""

    name = "sjf"

    def key(self, request, kv=None):
        expected = request.num_prompt_tokens + (request.expected_output_tokens or request.max_output_tokens)
        return (expected, request.arrival_time, request.seq)


@dataclass(slots=True)
class EDF(Policy):
    """Earliest deadline first; the deadline comes from a per-request SLO (inf when none)."""

    name = "edf"

    def key(self, request, kv=None):
        return (request.deadline, request.arrival_time, request.seq)


@dataclass(slots=True)
class LPM(Policy):
    """Longest cached prefix first (SGLang's LPM): more reuse, less prefill.

    Hit lengths change as the cache changes, so the queue is re-sorted at each step. Matching
    every waiting prompt each step costs too much on a long queue: beyond `max_queue` waiting
    requests it serves first come, first served, as SGLang does.
    """

    name = "lpm"
    static_order = False
    max_queue: int = 128

    def key(self, request, kv=None):
        hit = kv.get_computed_blocks(request)[1] if kv is not None else 0
        return (-hit, request.arrival_time, request.seq)

    victim_key = staticmethod(_ARRIVAL_ORDER)

    def order(self, requests, kv=None):
        if len(requests) > self.max_queue:
            return sorted(requests, key=self.victim_key)
        return sorted(requests, key=lambda r: self.key(r, kv))


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (FCFS, Priority, SJF, EDF, LPM)}


def make_policy(spec: str | Policy) -> Policy:
    if isinstance(spec, Policy):
        return spec
    if spec not in POLICIES:
        raise ValueError(f"policy={spec!r}: expected one of {sorted(POLICIES)}")
    return POLICIES[spec]()
