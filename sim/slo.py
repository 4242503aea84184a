"""Latency SLOs on a run's tail: p99 TTFT and p99 TPOT of the finished requests, and no request
left unfinished (rejected, or still running).

`SLOWatch` ends a run as soon as it can no longer meet them, which is exact: p99 is numpy's
linear interpolation between the sorted values j = floor(0.99 (n - 1)) and j + 1, which is at
least value j; once n - j requests have finished above the target, value j is above it, so p99
is too, whatever the others do. A rejected request fails the run at once. The search's failing
runs (most of them far past the knee) then stop early instead of draining a long queue.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from paged.core.request import RequestStatus
from paged.core.validation import is_number, require


@dataclass(frozen=True, slots=True)
class SLO:
    ttft_p99_s: float
    tpot_p99_s: float

    def __post_init__(self) -> None:
        for name in ("ttft_p99_s", "tpot_p99_s"):  # at or below 0 no run meets them: a search's answer is 0
            value = getattr(self, name)
            require(is_number(value) and value > 0, "SLO", name, value, "seconds > 0")

    def met_by(self, summary: dict) -> bool:
        """Every request finished, and p99 TTFT and TPOT within target (no TPOT: one-token outputs)."""
        tpot = summary["tpot_s"]["p99"]
        return (summary["num_finished"] == summary["num_requests"] and summary["ttft_s"]["p99"] <= self.ttft_p99_s
                and (math.isnan(tpot) or tpot <= self.tpot_p99_s))


def violations_to_fail(n: int) -> int:
    """How many of n values above a target put their p99 above it (n - floor(0.99 (n - 1)))."""
    return n - math.floor(0.99 * (n - 1)) if n else 1 << 62


class SLOMissed(Exception):
    """Raised out of the run's event loop (`sim.runner.simulate` catches it) to end it early."""


class SLOWatch:
    """Told of every request that leaves a run (`RequestLog.watch`); raises SLOMissed as soon as
    the run cannot meet `slo` any more."""

    __slots__ = ("slo", "ttft_left", "tpot_left")

    def __init__(self, slo: SLO, num_output_tokens: np.ndarray) -> None:
        self.slo = slo
        self.ttft_left = violations_to_fail(len(num_output_tokens))
        self.tpot_left = violations_to_fail(int(np.count_nonzero(num_output_tokens > 1)))

    def left(self, req, arrival_s: float, last_token_s: float) -> None:
        """A request left the run (finished or rejected): the same arithmetic as the summary's
        (TTFT from the client's arrival, `RequestLog.arrival_s`; TPOT up to its last token,
        `paged.metrics_summary.tpot`)."""
        if req.status == RequestStatus.REJECTED:
            raise SLOMissed(f"request {req.request_id} was rejected")
        first = req.first_token_time
        if first - arrival_s > self.slo.ttft_p99_s:
            self.ttft_left -= 1
        gen = req.num_output_tokens
        if gen > 1 and (last_token_s - first) / (gen - 1) > self.slo.tpot_p99_s:
            self.tpot_left -= 1
        if self.ttft_left <= 0 or self.tpot_left <= 0:
            raise SLOMissed("p99 TTFT or TPOT is past its target")
