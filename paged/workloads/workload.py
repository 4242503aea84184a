"""Workloads: requests as compact numpy columns, in arrival order.

A million requests must not become a million `Request` objects up front: the simulator
creates each `paged.Request` when it arrives, from these columns, and the scheduler drops it
when it finishes. Prefix block ids (Mooncake's `hash_ids`, or the system prompt of a
synthetic group) are stored once per distinct sequence (CSR: values + offsets) and referenced
per request, so 1M requests sharing 8 system prompts store 8 sequences.

Transforms return new workloads: `head(n)`, `window(start_s, end_s)`, `scale_time(s)`
(multiplies inter-arrival times, as Vidur's time_scale_factor: 0.5 doubles the load),
`at_rate(qps)` (the same, to a mean rate), `cap_lengths(max_model_len)` (counted in `num_capped`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .traces import read_trace

ARRIVAL_PROCESSES = ("poisson", "gamma", "constant")
MIN_CV, MAX_CV = 1e-6, 1e6  # gamma arrivals: from all but constant gaps to all requests in a few bursts


@dataclass(slots=True)
class Workload:
    arrival_s: np.ndarray  # float64, non-decreasing, the first at 0
    num_prompt_tokens: np.ndarray  # int64 >= 1
    num_output_tokens: np.ndarray  # int64 >= 1
    prefix_index: np.ndarray | None = None  # int64 per request: its sequence of prefix ids, -1 for none
    prefix_values: np.ndarray | None = None  # int64: all sequences of prefix block ids, concatenated
    prefix_offsets: np.ndarray | None = None  # int64: sequence s is values[offsets[s]:offsets[s+1]]
    hash_id_block_size: int = 512  # tokens per prefix id
    ids_cover_output: bool = False  # prefix ids name the output too (a conversation's next turn holds it)
    priority: np.ndarray | None = None  # optional per-request fields of paged.Request
    business_value: np.ndarray | None = None
    deadline_s: np.ndarray | None = None  # absolute, on the arrival clock
    name: str = ""
    num_capped: int = 0

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for col in ("num_prompt_tokens", "num_output_tokens", "prefix_index", "priority", "business_value",
                    "deadline_s"):
            v = getattr(self, col)
            if v is not None and len(v) != n:
                raise ValueError(f"Workload.{col} has {len(v)} rows, arrival_s has {n}")
        finite = np.isfinite(self.arrival_s)
        if not finite.all():
            i = int(np.argmin(finite))
            raise ValueError(f"Workload.arrival_s[{i}]={self.arrival_s[i]}: expected a finite time")
        if n and np.any(np.diff(self.arrival_s) < 0):
            raise ValueError("Workload.arrival_s must not go backwards")

    def __len__(self) -> int:
        return len(self.arrival_s)

    def prefix_ids(self, i: int) -> list[int] | None:
        if self.prefix_index is None:
            return None
        s = self.prefix_index[i]
        if s < 0:
            return None
        return self.prefix_values[self.prefix_offsets[s]:self.prefix_offsets[s + 1]].tolist()

    # -- transforms -----------------------------------------------------------------------------
    def _take(self, idx) -> Workload:
        def pick(col):
            return None if col is None else col[idx]

        return replace(self, arrival_s=self.arrival_s[idx], num_prompt_tokens=self.num_prompt_tokens[idx],
                       num_output_tokens=self.num_output_tokens[idx], prefix_index=pick(self.prefix_index),
                       priority=pick(self.priority), business_value=pick(self.business_value),
                       deadline_s=pick(self.deadline_s))

    def head(self, n: int) -> Workload:
        if n < 1:
            raise ValueError(f"num_requests={n}: expected >= 1")
        return self._take(slice(0, n))

    def window(self, start_s: float = 0.0, end_s: float = np.inf) -> Workload:
        """Requests arriving in [start_s, end_s), re-timed so that the first arrives at 0."""
        lo, hi = np.searchsorted(self.arrival_s, [start_s, end_s], side="left")
        if hi <= lo:
            raise ValueError(f"no request arrives in [{start_s}, {end_s}) s "
                             f"(the trace spans {self.arrival_s[0]:.3f}..{self.arrival_s[-1]:.3f} s)")
        return self._take(slice(lo, hi)).rebased()

    def rebased(self) -> Workload:
        """The same requests with the first arriving at 0 (deadlines move with them)."""
        t0 = self.arrival_s[0] if len(self) else 0.0
        if t0 == 0.0:
            return self
        return replace(self, arrival_s=self.arrival_s - t0,
                       deadline_s=None if self.deadline_s is None else self.deadline_s - t0)

    def scale_time(self, factor: float) -> Workload:
        """Multiply inter-arrival times by `factor` (0.5: twice the load)."""
        if not 0 < factor < np.inf:
            raise ValueError(f"time_scale={factor}: expected a finite value > 0")
        if factor == 1.0:
            return self
        t0 = self.arrival_s[0] if len(self) else 0.0
        with np.errstate(over="ignore"):
            arrival = t0 + (self.arrival_s - t0) * factor
        if not np.isfinite(arrival).all():
            raise ValueError(f"time_scale={factor}: the last arrival, {self.arrival_s[-1] - t0:g} s after the first, "
                             "would be beyond any representable time; expected a smaller factor")
        # A deadline is an SLO from arrival: it moves with its request.
        deadline = None if self.deadline_s is None else self.deadline_s + (arrival - self.arrival_s)
        return replace(self, arrival_s=arrival, deadline_s=deadline)

    def at_rate(self, qps: float) -> Workload:
        """The same requests with inter-arrival times rescaled to a mean of `qps` requests per
        second, the trace's burstiness kept (Poisson arrivals stay Poisson)."""
        if not qps > 0:
            raise ValueError(f"qps={qps}: expected requests per second > 0")
        if len(self) < 2 or not self.arrival_s[-1] > self.arrival_s[0]:
            raise ValueError(f"{self.name or 'the workload'}: a rate needs at least two distinct arrival times")
        native = (len(self) - 1) / (self.arrival_s[-1] - self.arrival_s[0])
        return self.scale_time(native / qps)

    def with_slo_deadlines(self, ttft_s: float = np.inf, tpot_s: float = np.inf) -> Workload:
        """Deadlines for `edf` from latency targets: a request should finish by
        arrival + ttft_s + tpot_s * (output tokens - 1), when it would meet both."""
        if not (ttft_s < np.inf or tpot_s < np.inf):
            raise ValueError("deadlines from SLOs need a TTFT or a TPOT target (slo_ttft_s, slo_tpot_s)")
        for name, v in (("slo_ttft_s", ttft_s), ("slo_tpot_s", tpot_s)):
            if not v > 0:
                raise ValueError(f"{name}={v}: expected seconds > 0")
        ttft = ttft_s if ttft_s < np.inf else 0.0
        tpot = tpot_s if tpot_s < np.inf else 0.0
        return replace(self, deadline_s=self.arrival_s + ttft + tpot * (self.num_output_tokens - 1))

    def cap_lengths(self, max_model_len: int) -> Workload:
        """Truncate prompts to max_model_len - 1 tokens and outputs to what is left, as a client
        would; `num_capped` counts the requests changed."""
        p = np.minimum(self.num_prompt_tokens, max_model_len - 1)
        o = np.minimum(self.num_output_tokens, max_model_len - p)
        changed = int(np.count_nonzero((p != self.num_prompt_tokens) | (o != self.num_output_tokens)))
        if not changed:
            return self
        return replace(self, num_prompt_tokens=p, num_output_tokens=o, num_capped=self.num_capped + changed)


# -- synthetic arrivals -------------------------------------------------------------------------
def synthetic_arrivals(n: int, rate: float, process: str = "poisson", cv: float = 1.0,
                       rng: np.random.Generator | int = 0) -> np.ndarray:
    """Arrival times (the first at 0) of n requests at `rate` per second: Poisson (exponential
    gaps), Gamma with coefficient of variation `cv` of the gaps (cv > 1 is burstier than
    Poisson: shape 1/cv^2), or constant gaps."""
    if not 0 < rate < np.inf:
        raise ValueError(f"rate={rate}: expected requests per second, finite and > 0")
    rng = np.random.default_rng(rng)
    if process == "poisson":
        gaps = rng.exponential(1.0 / rate, n)
    elif process == "gamma":
        # Beyond this range the Gamma shape 1/cv^2 overflows or underflows a float.
        if not MIN_CV <= cv <= MAX_CV:
            raise ValueError(f"cv={cv}: expected a coefficient of variation of the gaps in [{MIN_CV:g}, {MAX_CV:g}]")
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    elif process == "constant":
        gaps = np.full(n, 1.0 / rate)
    else:
        raise ValueError(f"unknown arrival process {process!r}: known are {list(ARRIVAL_PROCESSES)}")
    t = np.cumsum(gaps)
    return t - t[0] if n else t


def lengths_workload(num_prompt_tokens, num_output_tokens, rate: float, process: str = "poisson", cv: float = 1.0,
                     seed: int = 0, name: str = "synthetic") -> Workload:
    p = np.asarray(num_prompt_tokens, dtype=np.int64)
    o = np.asarray(num_output_tokens, dtype=np.int64)
    return Workload(synthetic_arrivals(len(p), rate, process, cv, seed), p, o, name=name)


def sample_lengths(source: Workload, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n (prompt, output) pairs drawn with replacement from a trace's rows."""
    rows = np.random.default_rng(seed).integers(0, len(source), n)
    return source.num_prompt_tokens[rows], source.num_output_tokens[rows]


def shared_prefix_workload(num_requests: int, num_groups: int, prefix_tokens: int, suffix_tokens: int,
                           output_tokens: int, rate: float, process: str = "poisson", cv: float = 1.0,
                           seed: int = 0, hash_id_block_size: int = 16) -> Workload:
    """G groups, each sharing a system prompt of P tokens, then a request-specific suffix.

    Requests are assigned to groups round robin. The shared prompt is named by one id per
    `hash_id_block_size` tokens (whole id-blocks only: a partial last block is not shared);
    the suffix carries no ids, so it is never shared, as in a length-only trace.
    """
    if (num_groups < 1 or prefix_tokens < 0 or suffix_tokens < 0 or prefix_tokens + suffix_tokens < 1
            or output_tokens < 1):
        raise ValueError(f"shared-prefix workload GROUPS,PREFIX,SUFFIX,OUTPUT={num_groups},{prefix_tokens},"
                         f"{suffix_tokens},{output_tokens}: expected GROUPS >= 1, PREFIX and SUFFIX >= 0 with "
                         "PREFIX + SUFFIX >= 1 (a non-empty prompt), and OUTPUT >= 1")
    ids_per_group = prefix_tokens // hash_id_block_size
    values = np.arange(num_groups * ids_per_group, dtype=np.int64)
    offsets = np.arange(num_groups + 1, dtype=np.int64) * ids_per_group
    group = np.arange(num_requests, dtype=np.int64) % num_groups
    return Workload(
        synthetic_arrivals(num_requests, rate, process, cv, seed),
        np.full(num_requests, prefix_tokens + suffix_tokens, dtype=np.int64),
        np.full(num_requests, output_tokens, dtype=np.int64),
        prefix_index=group if ids_per_group else None,
        prefix_values=values if ids_per_group else None,
        prefix_offsets=offsets if ids_per_group else None,
        hash_id_block_size=hash_id_block_size,
        name=f"shared-prefix(G={num_groups},P={prefix_tokens})",
    )


def load_workload(trace: str | Path, fmt: str = "auto", *, num_requests: int | None = None,
                  start_s: float = 0.0, duration_s: float | None = None, time_scale: float = 1.0,
                  arrival: str = "poisson", rate: float | None = None, cv: float = 1.0, seed: int = 0,
                  max_model_len: int | None = None) -> Workload:
    """Read a trace and `select` from it. Length-only traces get synthetic arrivals (`arrival`
    at `rate` per second). The first `num_requests` of the trace, with no time window before them, are
    all that is read of it (`read_trace`'s max_rows)."""
    first_only = num_requests is not None and num_requests >= 1 and not start_s and duration_s is None
    cols = read_trace(trace, fmt, max_rows=num_requests if first_only else None)
    name = Path(trace).name
    if cols.arrival_s is None:
        if rate is None:
            raise ValueError(f"{trace} has no arrival times: give a rate (--rate) for synthetic {arrival} arrivals")
        w = lengths_workload(cols.num_prompt_tokens, cols.num_output_tokens, rate, arrival, cv, seed, name)
    elif rate is not None:
        raise ValueError(f"rate={rate}: {trace} has arrival times, which a rate would replace; expected no rate "
                         "(--rate) for a timed trace: --time-scale changes its load")
    else:
        index, values, offsets = (None,) * 3 if cols.hash_ids is None else packed_ids(cols.hash_ids)
        w = Workload(cols.arrival_s, cols.num_prompt_tokens, cols.num_output_tokens, index, values, offsets,
                     name=name)
    w = replace(w, priority=cols.priority, business_value=cols.business_value,
                deadline_s=None if cols.slo_s is None else w.arrival_s + cols.slo_s).rebased()
    if len(w) == 0:
        raise ValueError(f"{trace} holds no requests")
    return select(w, num_requests=num_requests, start_s=start_s, duration_s=duration_s, time_scale=time_scale,
                  max_model_len=max_model_len)


def packed_ids(seqs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each request's list of prefix ids as a Workload holds them (`prefix_index`, `prefix_values`,
    `prefix_offsets`): request i's ids are values[offsets[i]:offsets[i + 1]], and a request without
    ids has index -1."""
    lens = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    offsets = np.concatenate(([0], np.cumsum(lens)))
    values = np.fromiter((x for s in seqs for x in s), dtype=np.int64, count=int(offsets[-1]))
    return np.where(lens > 0, np.arange(len(lens)), -1), values, offsets


def select(w: Workload, *, num_requests: int | None = None, start_s: float = 0.0, duration_s: float | None = None,
           time_scale: float = 1.0, max_model_len: int | None = None) -> Workload:
    """The options in the order a researcher means them: the time window, then the first N
    requests, then time scaling, then the length cap."""
    if start_s or duration_s is not None:
        w = w.window(start_s, np.inf if duration_s is None else start_s + duration_s)
    if num_requests is not None:
        w = w.head(num_requests)
    w = w.scale_time(time_scale)
    if max_model_len is not None:
        w = w.cap_lengths(max_model_len)
    return w
