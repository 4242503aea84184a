"""Summary statistics of per-request latencies, shared by the simulator's summary (`sim.report`)
and the load generator against a real server (`paged.serve.bench_serve`), so that a simulated
and a measured run are summarised by the same arithmetic and under the same JSON keys.
"""
from __future__ import annotations

import math

import numpy as np


def stats_of(values: np.ndarray) -> dict[str, float]:
    """mean, p50, p90, p99 (linear interpolation, as numpy); NaN when there are no values."""
    v = values[~np.isnan(values)]
    if not len(v):
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {"mean": float(v.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def tpot(first_token_s: np.ndarray, last_token_s: np.ndarray, num_generated: np.ndarray) -> np.ndarray:
    """A request's time per output token as a streaming client sees it, (last token - first
    token) / (tokens - 1): vLLM's (E2E - TTFT) / (tokens - 1) wherever a request ends at its last
    token (a static batch ends its members later); NaN under 2 tokens."""
    gen = np.asarray(num_generated, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(gen > 1, (last_token_s - first_token_s) / (gen - 1), np.nan)


def goodput(finished: np.ndarray, ttft_s: np.ndarray, tpot_s: np.ndarray, ttft_slo_s: float, tpot_slo_s: float,
            duration_s: float) -> dict[str, float]:
    """DistServe's goodput: finished requests per second that meet both the TTFT and the TPOT
    target (a one-token output has no TPOT and meets it), and the attainment (of all requests)."""
    ok = finished & (ttft_s <= ttft_slo_s) & (np.isnan(tpot_s) | (tpot_s <= tpot_slo_s))
    n = len(finished)
    return {"ttft_slo_s": ttft_slo_s, "tpot_slo_s": tpot_slo_s,
            "goodput_req_s": float(ok.sum() / duration_s) if duration_s else math.nan,
            "slo_attainment": float(ok.sum() / n) if n else math.nan}


def jsonable(x):
    """A summary made fit for strict JSON: NaN becomes null, numpy scalars Python numbers."""
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, float) and math.isnan(x):
        return None
    if hasattr(x, "item"):  # numpy scalars
        return jsonable(x.item())
    return x


# What a reader would otherwise misread, said beside the value (docs/summary_keys.md has every key).
NOTES = {
    "num_capped": "requests cut to fit max_model_len before the run: the prompt to max_model_len - 1 tokens, "
                  "the output to what is left; --no-cap sends them whole, to be rejected",
    "busy_fraction": "of the time some request was in a step: not GPU utilisation",
    "kv_tokens_mean": "of the KV slots held a token: a fraction, not a count",
    "pooled_lru_hit_rate": "the yardstick of cache-aware routing: one LRU cache as large as all the replicas' "
                           "caches, over the trace in arrival order; a reference, not a bound (routing can pass it)",
}


def format_summary(s: dict) -> str:
    """The summary as an aligned text table, with a note where a value is easily misread, and
    where every key is explained."""
    lines = []
    for k, v in s.items():
        if isinstance(v, dict):
            v = "  ".join(f"{q} {_fmt(x)}" for q, x in v.items())
        else:
            v = _fmt(v)
        note = NOTES.get(k) if s[k] else None  # nothing capped: nothing to explain
        lines.append(f"{k:<28} {v}" + (f"  # {note}" if note else ""))
    lines.append("(every key: docs/summary_keys.md)")
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.3e}"
    return str(v)
