"""A cost model fitted to measured step times (`python -m paged.engine profile` writes them).

The profile is JSON: {"format": "paged-step-profile/1", "model", "device", "dtype",
"block_size", "num_threads", "samples": [{"num_prefill_tokens", "prefill_attention_pairs",
"num_decode_tokens", "decode_context_sum", "num_seqs", "time_s"}, ...]}.

The fit is non-negative least squares of the step time on the features plus an intercept,
each sample weighted by 1/time so that a 5 ms decode step counts as much as a 500 ms
prefill (the error that matters is relative). Non-negative, because each feature is work
that cannot make a step faster; and linear, because it is what the fast path's closed form
needs (a maximum of such fits would do too). The fit error is measured on held-out samples
(k-fold cross-validation) and reported with the model.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .cost_model import FEATURES, CostModel

PROFILE_FORMAT = "paged-step-profile/1"
SAMPLE_KEYS = FEATURES[1:]


@dataclass(slots=True)
class ProfileFit:
    cost_model: CostModel
    coefficients_s: dict[str, float]  # seconds per unit of each feature
    heldout_mape: float  # mean |predicted - measured| / measured over held-out samples
    heldout_max_ape: float
    num_samples: int


def nnls(A: np.ndarray, b: np.ndarray, tol: float = 1e-12) -> np.ndarray:
    """min ||A x - b|| subject to x >= 0 (Lawson and Hanson's active-set method)."""
    n = A.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(3 * n + 10):
        w = A.T @ (b - A @ x)
        candidates = ~passive & (w > tol)
        if not candidates.any():
            break
        passive[np.argmax(np.where(candidates, w, -np.inf))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if (z[passive] > tol).all():
                x = z
                break
            neg = passive & (z <= tol)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x


def _fit(X: np.ndarray, t: np.ndarray) -> np.ndarray:
    scale = np.maximum(X.max(axis=0), 1e-30)  # columns span 1..1e9: scale for a well-conditioned solve
    A = X / scale / t[:, None]
    return nnls(A, np.ones(len(t))) / scale


def read_profile(path: str | Path) -> dict:
    path = Path(path)
    try:
        prof = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(prof, dict) or prof.get("format") != PROFILE_FORMAT:
        got = prof.get("format") if isinstance(prof, dict) else type(prof).__name__
        raise ValueError(f"{path}: format={got!r}: expected {PROFILE_FORMAT!r}")
    samples = prof.get("samples")
    if not isinstance(samples, list) or len(samples) < len(FEATURES):
        raise ValueError(f"{path}: expected at least {len(FEATURES)} samples, got "
                         f"{len(samples) if isinstance(samples, list) else samples!r}")
    for i, s in enumerate(samples):
        for key in (*SAMPLE_KEYS, "time_s"):
            v = s.get(key) if isinstance(s, dict) else None
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or (key == "time_s" and v <= 0):
                raise ValueError(f"{path}: samples[{i}].{key}={v!r}: expected a number >= 0 (time_s > 0)")
    return prof


def fit_profile(path: str | Path, folds: int = 5) -> ProfileFit:
    prof = read_profile(path)
    samples = prof["samples"]
    X = np.array([[1.0, *(s[k] for k in SAMPLE_KEYS)] for s in samples], dtype=np.float64)
    t = np.array([s["time_s"] for s in samples], dtype=np.float64)
    order = np.random.default_rng(0).permutation(len(t))
    errors = np.empty(len(t))
    k = min(folds, len(t))
    for f in range(k):
        test = order[f::k]
        train = np.setdiff1d(order, test)
        coef = _fit(X[train], t[train])
        errors[test] = np.abs(X[test] @ coef - t[test]) / t[test]
    coef = _fit(X, t)
    name = f"profile:{prof.get('model', '?')}@{prof.get('device', '?')}"
    desc = f"fitted to {len(t)} samples of {path}; held-out error {errors.mean():.1%} mean, {errors.max():.1%} max"
    return ProfileFit(CostModel([tuple(coef)], name=name, description=desc), dict(zip(FEATURES, coef, strict=True)),
                      float(errors.mean()), float(errors.max()), len(t))
