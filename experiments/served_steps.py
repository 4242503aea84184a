"""The served engines' steps against the profile: where a deployment's time goes that the prediction
does not see.

A replica's `/debug/steps` (`paged.engine.step_log`) gives every step's shape and forward-pass
times. Two things are held against the profile the prediction used:

- the forward passes: each step's measured time over the profile's fitted time for the same shape
  (`sim.profiled`), summed per kind (decode-only; with a prefill chunk) and per decode batch size.
  Above 1 means the served engine runs the same shapes slower than the profiling engines did (its
  process and machine also run the HTTP servers, the router and the clients);
- the gaps between forward passes while the engine had work (the gap before a step that decodes: a
  request was running, so the engine did not wait for one): the scheduler, the outputs, the
  hand-off to the event loop and back. The simulator charges nothing there.

`drift` holds a replay's steps against the calibration the prediction assumed: how far the machine
ran off it during the replay (explains a miss; never a prediction of its own).

`served_cost_model` turns what a calibration load measured this way into the cost model of the
engines as they serve: the profile's, its forward times scaled by the calibration's measured over
profiled time, plus the busy gap on every step.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from paged.engine.profile import FEATURES
from sim.profiled import ProfiledCostModel, ProfileFit, fit_profile


def step_frame(steps: list[dict], profile_path: str | Path) -> pd.DataFrame:
    """One row per step that ran the model (sorted by start), with the profile's time for its shape and
    the gap since the previous step's end."""
    model = fit_profile(profile_path).cost_model
    frame = pd.DataFrame(steps, columns=[*FEATURES, "seq", "start_s", "end_s", "forward_s", "decode_max_context"])
    frame = frame[frame.num_seqs > 0].sort_values("start_s").reset_index(drop=True)
    frame["profile_s"] = [model.step_seconds(**{k: int(row[k]) for k in FEATURES})
                          for row in frame[list(FEATURES)].to_dict("records")] if len(frame) else 0.0
    frame["gap_s"] = frame.start_s - frame.end_s.shift()
    return frame


def summary(frame: pd.DataFrame) -> dict:
    """Measured over profiled forward time per kind, per decode batch size (decode-only steps), and the
    busy gaps (before steps that decode), as totals and per step."""
    decode_only = frame.num_prefill_tokens == 0
    kinds = {"all": frame, "decode": frame[decode_only], "prefill/mixed": frame[~decode_only]}
    ratio = {k: float(f.forward_s.sum() / f.profile_s.sum()) for k, f in kinds.items() if len(f)}
    by_batch = {int(n): float(f.forward_s.sum() / f.profile_s.sum())
                for n, f in frame[decode_only].groupby("num_decode_tokens")}
    busy = frame[(frame.num_decode_tokens > 0) & frame.gap_s.notna()]
    return {"num_steps": len(frame), "forward_over_profile": ratio, "decode_forward_over_profile_by_batch": by_batch,
            "busy_gap_s": {"mean": float(busy.gap_s.mean()) if len(busy) else float("nan"),
                           "p50": float(busy.gap_s.median()) if len(busy) else float("nan"),
                           "total": float(busy.gap_s.sum()), "count": len(busy)},
            "forward_s_total": float(frame.forward_s.sum()), "profile_s_total": float(frame.profile_s.sum())}


def describe(name: str, s: dict) -> str:
    r = s["forward_over_profile"]
    gap = s["busy_gap_s"]
    batches = " ".join(f"{n}:{v:.2f}" for n, v in sorted(s["decode_forward_over_profile_by_batch"].items()))
    if not s["num_steps"]:
        return f"{name}: no steps"
    return (f"{name}: {s['num_steps']} steps, forward time over the profile's x{r.get('all', np.nan):.3f} "
            f"(decode x{r.get('decode', np.nan):.3f}, prefill/mixed x{r.get('prefill/mixed', np.nan):.3f}; "
            f"decode by batch {batches}); between busy steps {gap['mean'] * 1e3:.1f} ms mean, "
            f"{gap['p50'] * 1e3:.1f} ms p50, {gap['total']:.2f} s in all over {gap['count']} steps "
            f"(forward {s['forward_s_total']:.2f} s)")


def drift(s: dict, forward_over_profile: float, gap_s: float) -> dict:
    """A replay's steps (`summary` of its frame) against the served cost model the prediction used
    (`served_cost_model` of the calibration's `forward_over_profile` and `gap_s`): the forward time
    over the profile's, as measured in the replay and as the calibration assumed, and the served
    step time (forward passes plus busy gaps) measured over the same steps as the prediction's
    model times them. Above 1: the machine ran the replay slower than the prediction assumed."""
    forward = s["forward_over_profile"].get("all", float("nan"))
    gap = s["busy_gap_s"]
    assumed = forward_over_profile * s["profile_s_total"] + gap_s * gap["count"]
    return {"forward_over_profile": forward, "assumed_forward_over_profile": forward_over_profile,
            "busy_gap_s": gap["mean"], "assumed_busy_gap_s": gap_s,
            "step_time_over_assumed": (s["forward_s_total"] + gap["total"]) / assumed if assumed > 0 else float("nan")}


def served_cost_model(fit: ProfileFit, forward_over_profile: float, gap_s: float) -> ProfiledCostModel:
    """The profile's fitted model as the engines run under the serving stack: every step's forward time
    times `forward_over_profile`, and `gap_s` more per step (the intercept: the simulator starts the
    next step when one ends). Both are measured on a calibration load (`summary`), never on the
    replay being predicted."""
    if not forward_over_profile > 0 or not gap_s >= 0:
        raise ValueError(f"served_cost_model: forward_over_profile={forward_over_profile!r}, gap_s={gap_s!r}: "
                         "expected a factor > 0 and seconds >= 0")
    intercept, *rest = (forward_over_profile * c for c in fit.coefficients_s.values())
    return ProfiledCostModel((intercept + gap_s, *rest),
                             {n: forward_over_profile * v for n, v in fit.decode_corrections_s.items()},
                             {n: forward_over_profile * v for n, v in fit.prefill_corrections_s.items()},
                             f"{fit.cost_model.name} served", f"{fit.cost_model.description}; forward times "
                             f"x{forward_over_profile:.3f} and {gap_s * 1e3:.2f} ms between steps, as served")
