"""A cost model fitted to measured step times (`python -m paged.engine profile` writes them).

The profile is JSON: {"format": "paged-step-profile/1", "model", "device", "dtype",
"block_size", "num_gpu_blocks" (the KV cache profiled; older profiles lack it), "num_threads",
"samples": [{"num_prefill_tokens", "prefill_attention_pairs", "num_decode_tokens",
"decode_context_sum", "num_seqs", "time_s"}, ...]}.

The model is a line plus a correction by number of sequences. The line is non-negative least
squares of the step time on the features plus an intercept, each sample weighted by 1/time so
that a 5 ms decode step counts as much as a 500 ms prefill (the error that matters is relative).
Non-negative, because each feature is work that cannot make a step faster.

What a line misses: a matmul's time per row is not constant at a few rows. On a CPU, torch's
matmul goes row by row below 4 rows, so a decode step of 3 sequences is slower than one of 4 (the
measured steps go 41, 64, 80, 65 ms for batches 1-4), and in every step the LM head runs one row per
sequence that samples. No line through batch sizes follows that, so each step also gets a
correction that depends on its kind and its number of sequences only: one table for decode-only
steps (by batch size: all the matmuls run that many rows) and one for steps with a prefill chunk
(by sequences: the LM head's rows; the chunk's rows keep the other matmuls efficient). An entry
is the mean residual of the line over the profile's steps of that kind and size (weighted by
1/time^2, as the line's fit), linearly interpolated between measured sizes and held at the
nearest one outside them, where the line's slope carries on alone. Why by number of sequences and
nothing finer: within a fast-path window the decode batch is fixed, so each step there is still a
line in the step index plus a constant, and `decode_lines` stays exact (`sim.window`).

The fit error is measured on held-out samples (k-fold cross-validation) and reported with the
model, the line alone beside it. Each table of corrections is kept only if it lowers that error,
the decode table and the prefill table judged apart: a profile with one or two samples per size
lets them fit the noise.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .clock import TICKS_PER_S, to_ticks
from .cost_model import FEATURES, CostModel

PROFILE_FORMAT = "paged-step-profile/1"
SAMPLE_KEYS = FEATURES[1:]
VARIANTS = ((False, False), (True, False), (False, True), (True, True))  # correction tables kept: (decode, prefill)


class ProfiledCostModel(CostModel):
    """A fitted line (one piece) plus a correction by step kind and number of sequences (see the module doc)."""

    __slots__ = ("decode_ticks", "prefill_ticks")

    def __init__(self, coefficients_s: tuple[float, ...], decode_corrections_s: dict[int, float],
                 prefill_corrections_s: dict[int, float], name: str = "", description: str = "") -> None:
        super().__init__([coefficients_s], name=name, description=description)
        # Each table runs from 0 sequences (no correction) to the largest measured size. A correction
        # never takes a step below one tick: it is at least 1 minus the least the line gives a step of
        # that kind and size (all features but the sequences at their least, coefficients >= 0).
        self.decode_ticks = _table(decode_corrections_s, lambda n: self._line_ticks(0, 0, n, 0, n))
        self.prefill_ticks = _table(prefill_corrections_s, lambda n: self._line_ticks(1, 1, 0, 0, n))

    def _line_ticks(self, *features: int) -> int:
        return max(sum(c * x for c, x in zip(p, (1, *features), strict=True)) for p in self.pieces)

    def _correction(self, num_prefill_tokens: int, num_seqs: int) -> int:
        table = self.prefill_ticks if num_prefill_tokens else self.decode_ticks
        return table[min(num_seqs, len(table) - 1)]

    def step_ticks(self, out) -> int:
        num_seqs = out.num_decode_tokens + len(out.prefill_requests)
        return super().step_ticks(out) + self._correction(out.num_prefill_tokens, num_seqs)

    def step_seconds(self, num_prefill_tokens: int = 0, prefill_attention_pairs: int = 0, num_decode_tokens: int = 0,
                     decode_context_sum: int = 0, num_seqs: int = 0, num_swapped_blocks: int = 0) -> float:
        ticks = self._line_ticks(num_prefill_tokens, prefill_attention_pairs, num_decode_tokens, decode_context_sum,
                                 num_seqs) + self.swap_ticks_per_block * num_swapped_blocks
        return (ticks + self._correction(num_prefill_tokens, num_seqs)) / TICKS_PER_S

    def decode_lines(self, num_seqs: int, context_sum: int) -> list[tuple[int, int]]:
        correction = self._correction(0, num_seqs)
        return [(a + correction, b) for a, b in super().decode_lines(num_seqs, context_sum)]


def _table(corrections_s: dict[int, float], least_ticks) -> tuple[int, ...]:
    """Ticks added to a step of n = 0 .. max measured sequences: interpolated between the measured
    sizes, the nearest one's outside them, and never so negative that a step drops below one tick."""
    sizes = sorted(corrections_s)
    values = [corrections_s[n] for n in sizes]
    return (0, *(max(1 - least_ticks(n), to_ticks(float(np.interp(n, sizes, values))))
                 for n in range(1, sizes[-1] + 1 if sizes else 1)))


@dataclass(slots=True)
class ProfileFit:
    cost_model: ProfiledCostModel
    coefficients_s: dict[str, float]  # the line: seconds per unit of each feature
    decode_corrections_s: dict[int, float]  # decode-only steps: measured batch size -> seconds added to the line
    prefill_corrections_s: dict[int, float]  # steps with a prefill chunk: measured sequences -> seconds added
    # (both empty when the corrections did not lower the held-out error)
    heldout_mape: float  # mean |predicted - measured| / measured over held-out samples
    heldout_max_ape: float
    line_heldout_mape: float  # the same for the line alone (no corrections)
    line_heldout_max_ape: float
    num_samples: int

    def scaled(self, factor: float) -> ProfiledCostModel:
        """The same model on a machine `factor` times slower: every step's time times `factor` (how much a
        prediction moves when the machine's speed does)."""
        if not factor > 0:
            raise ValueError(f"ProfileFit.scaled: factor={factor!r}: expected a number > 0")
        model = self.cost_model
        return ProfiledCostModel(tuple(factor * c for c in self.coefficients_s.values()),
                                 {n: factor * v for n, v in self.decode_corrections_s.items()},
                                 {n: factor * v for n, v in self.prefill_corrections_s.items()},
                                 f"{model.name} x{factor:g}", f"{model.description}; times x{factor:g}")


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


def relative_nnls(X: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Coefficients >= 0 of X @ c ~ t, least squares of the relative error (each row divided by its t)."""
    scale = np.maximum(X.max(axis=0), 1e-30)  # columns span 1..1e9: scale for a well-conditioned solve
    A = X / scale / t[:, None]
    return nnls(A, np.ones(len(t))) / scale


ALTERNATIVES = "; --cost-model also takes calibrated, vidur:DIR or roofline"


def read_profile(path: str | Path) -> dict:
    path = Path(path)
    try:
        prof = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: byte {e.start} is not UTF-8 text: expected a {PROFILE_FORMAT} JSON file "
                         f"(python -m paged.engine profile writes one){ALTERNATIVES}") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read the cost model profile ({e.strerror}): expected a {PROFILE_FORMAT} "
                         f"JSON file{ALTERNATIVES}") from None
    if not isinstance(prof, dict) or prof.get("format") != PROFILE_FORMAT:
        got = prof.get("format") if isinstance(prof, dict) else type(prof).__name__
        raise ValueError(f"{path}: format={got!r}: expected {PROFILE_FORMAT!r}{ALTERNATIVES}")
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


def _catalog_name(model: str) -> str:
    """The simulator's name for a model (a catalog name, a Hugging Face id, a config folder), or the name
    as given, lower-cased, where the simulator does not know it (a profiled folder absent here)."""
    from .models import get_model

    try:
        return get_model(model).name
    except (ValueError, OSError):
        return model.lower()


def mismatch_warning(path: str | Path, model: str, num_gpu_blocks: int | None, hardware: str) -> str | None:
    """Why `sim run --cost-model PATH` would not simulate the profiled engine, with the options that would:
    the profile times steps of its own model, and the KV cache (left to `--hardware`) is sized for
    another, so a run with the defaults (llama-2-7b on an A100) mixed a CPU's SmolLM2 step times with
    a GPU's Llama cache and said only the latter. None when both match, or the profile cannot be read
    (its error comes when the run loads it)."""
    try:
        prof = read_profile(path)
    except ValueError:
        return None
    profiled, blocks = prof.get("model"), prof.get("num_gpu_blocks")
    other_model = isinstance(profiled, str) and _catalog_name(profiled) != _catalog_name(model)
    if not other_model and num_gpu_blocks is not None:
        return None
    of = f" of {profiled}" if isinstance(profiled, str) else ""
    size = f"{blocks:,} KV blocks" if isinstance(blocks, int) else "its KV cache not recorded"
    problems = ([f"--model is {model}"] if other_model else []) + (
        [f"the KV cache is sized from {hardware}'s memory (--hardware)"] if num_gpu_blocks is None else [])
    options = ([f"--model {_catalog_name(profiled)}"] if other_model else []) + (
        [f"--num-gpu-blocks {blocks if isinstance(blocks, int) else 'N (the profiled engine printed it)'}"]
        if num_gpu_blocks is None else [])
    return (f"step times come from the profile {path}{of} ({size}), but {' and '.join(problems)}; to simulate the "
            f"profiled engine: {' '.join(options)}")


def _fit_model(X: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, dict[int, float], dict[int, float]]:
    """The line fitted to samples `X` (intercept column first) and times `t`, then the corrections fitted
    to what it leaves: per step kind (decode-only, with a prefill chunk) and number of sequences, the
    1/t^2-weighted mean residual."""
    coef = relative_nnls(X, t)
    residual, weight = t - X @ coef, 1 / t**2
    corrections = []
    for kind in (X[:, 1] == 0, X[:, 1] > 0):
        sizes, r, w = X[kind, 5].astype(int), residual[kind], weight[kind]
        corrections.append({int(n): float(np.average(r[sizes == n], weights=w[sizes == n])) for n in np.unique(sizes)})
    return coef, *corrections


def _relative_errors(model: CostModel, X: np.ndarray, t: np.ndarray) -> np.ndarray:
    predicted = np.array([model.step_seconds(*(int(v) for v in row[1:])) for row in X])
    return np.abs(predicted - t) / t


def fit_profile(path: str | Path, folds: int = 5) -> ProfileFit:
    prof = read_profile(path)
    samples = prof["samples"]
    X = np.array([[1.0, *(s[k] for k in SAMPLE_KEYS)] for s in samples], dtype=np.float64)
    t = np.array([s["time_s"] for s in samples], dtype=np.float64)
    order = np.random.default_rng(0).permutation(len(t))
    errors = {kept: np.empty(len(t)) for kept in VARIANTS}
    k = min(folds, len(t))
    for f in range(k):
        test = order[f::k]
        train = np.setdiff1d(order, test)
        coef, decode, prefill = _fit_model(X[train], t[train])
        for kept, e in errors.items():
            model = ProfiledCostModel(tuple(coef), decode if kept[0] else {}, prefill if kept[1] else {})
            e[test] = _relative_errors(model, X[test], t[test])
    coef, decode, prefill = _fit_model(X, t)
    # Corrections fitted to a size or two samples each can fit the noise: each table (decode steps, steps with
    # a prefill chunk) is kept only if it predicts better, judged apart, so that noisy mixed steps do not
    # throw away the decode table (a profile on a busy machine lost it so: decode batches 1-3 then came out
    # 25% slow, 10% and 35% fast in `experiments/deploy_check.py`). The simplest of equals wins.
    kept = min(VARIANTS, key=lambda v: (round(errors[v].mean(), 12), sum(v)))
    decode, prefill = (decode if kept[0] else {}), (prefill if kept[1] else {})
    form = {(False, False): "a line (corrections by number of sequences did not help)",
            (True, False): "a line plus corrections by number of sequences for decode steps (not for steps with a "
                           "prefill chunk: they did not help)",
            (False, True): "a line plus corrections by number of sequences for steps with a prefill chunk (not for "
                           "decode steps: they did not help)",
            (True, True): "a line plus corrections by number of sequences"}[kept]
    errors, line_errors = errors[kept], errors[(False, False)]
    name = f"profile:{prof.get('model', '?')}@{prof.get('device', '?')}"
    desc = (f"fitted to {len(t)} samples of {path}: {form}; held-out error {errors.mean():.1%} mean, "
            f"{errors.max():.1%} max (the line alone: {line_errors.mean():.1%}, {line_errors.max():.1%})")
    return ProfileFit(ProfiledCostModel(tuple(coef), decode, prefill, name, desc),
                      dict(zip(FEATURES, coef, strict=True)), decode, prefill, float(errors.mean()),
                      float(errors.max()), float(line_errors.mean()), float(line_errors.max()), len(t))
