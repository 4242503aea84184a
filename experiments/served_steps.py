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
engines as they serve (`ServedSpeed`): the profile's forward times scaled, plus a cost per sequence in
the step, plus the busy gap on every step.

Why a cost per sequence: each sequence a step runs sends its token to a client, and the front end's
work for it (the SSE event, the hand-off to the event loop) runs in the engine's process while the
next forward pass runs, taking the interpreter from it. Served, the engines' steps cost 2-6 ms more per
sequence than the profile's (least squares on deploy_check's steps, three runs), so one factor over
all steps over-priced the prefills (one sequence, hundreds of tokens; run at x0.97-1.03 the profile's)
to pay for the decode batches (x1.04-1.16, growing with the batch), and the prediction's cold-prompt
TTFTs came out 5-8% slow.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
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


@dataclass(frozen=True, slots=True)
class ServedSpeed:
    """The engines' speed as they serve, against the profile: a step's forward pass takes `factor` times
    the profile's time for its shape plus `per_seq_s` per sequence in it, and `gap_s` passes between
    steps. The default is the profile's own speed."""

    factor: float = 1.0
    per_seq_s: float = 0.0
    gap_s: float = 0.0

    def __post_init__(self) -> None:
        if not (self.factor > 0 and self.per_seq_s >= 0 and self.gap_s >= 0):
            raise ValueError(f"ServedSpeed(factor={self.factor!r}, per_seq_s={self.per_seq_s!r}, gap_s={self.gap_s!r})"
                             ": expected a factor > 0 and seconds >= 0")

    def slower(self, k: float) -> ServedSpeed:
        """Forward passes `k` times as long (the machine's speed moving); the gaps as they are."""
        return replace(self, factor=self.factor * k, per_seq_s=self.per_seq_s * k)


def served_fit(frame: pd.DataFrame) -> dict[str, float]:
    """forward_s ~ factor * profile_s + per_seq_s * num_seqs, by least squares over the steps; where
    that does not come out as a factor > 0 and a cost >= 0 (few or alike steps), the plain ratio of
    the totals and no cost per sequence."""
    if len(frame) >= 2:
        (factor, per_seq_s), *_ = np.linalg.lstsq(frame[["profile_s", "num_seqs"]].to_numpy(float),
                                                  frame.forward_s.to_numpy(float), rcond=None)
        if factor > 0 and per_seq_s >= 0:
            return {"factor": float(factor), "per_seq_s": float(per_seq_s)}
    return {"factor": float(frame.forward_s.sum() / frame.profile_s.sum()) if len(frame) else 1.0, "per_seq_s": 0.0}


def summary(frame: pd.DataFrame) -> dict:
    """Measured over profiled forward time per kind, per decode batch size (decode-only steps), the
    served speed's fit (`served_fit`), and the busy gaps (before steps that decode), as totals and per step."""
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
            "served_fit": served_fit(frame), "num_seqs_total": int(frame.num_seqs.sum()),
            "forward_s_total": float(frame.forward_s.sum()), "profile_s_total": float(frame.profile_s.sum())}


def served_speed(s: dict) -> ServedSpeed:
    """The served speed a `summary` measured: its fit and its mean busy gap."""
    gap = s["busy_gap_s"]["mean"]
    return ServedSpeed(**s["served_fit"], gap_s=gap if gap == gap else 0.0)  # no busy gap seen (NaN): none


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
            f"(forward {s['forward_s_total']:.2f} s: x{s['served_fit']['factor']:.3f} the profile's plus "
            f"{s['served_fit']['per_seq_s'] * 1e3:.2f} ms a sequence)")


def drift(s: dict, assumed: ServedSpeed) -> dict:
    """A replay's steps (`summary` of its frame) against the served speed the prediction assumed
    (`assumed`, the calibration's): the forward time over the profile's, as measured in the replay
    and as `assumed` gives these steps, and the served step time (forward passes plus busy gaps)
    measured over the same steps as `assumed` times them. Above 1: the machine ran the replay slower
    than the prediction assumed. `served` is the replay's own speed (`served_speed`, for hindsight)."""
    forward = s["forward_over_profile"].get("all", float("nan"))
    gap = s["busy_gap_s"]
    assumed_forward = assumed.factor * s["profile_s_total"] + assumed.per_seq_s * s["num_seqs_total"]
    total = assumed_forward + assumed.gap_s * gap["count"]
    return {"forward_over_profile": forward,
            "assumed_forward_over_profile": assumed_forward / s["profile_s_total"] if s["profile_s_total"] else
            float("nan"), "busy_gap_s": gap["mean"], "assumed_busy_gap_s": assumed.gap_s,
            "step_time_over_assumed": (s["forward_s_total"] + gap["total"]) / total if total > 0 else float("nan"),
            "assumed": asdict(assumed), "served": asdict(served_speed(s))}


def served_cost_model(fit: ProfileFit, served: ServedSpeed) -> ProfiledCostModel:
    """The profile's fitted model as the engines run under the serving stack (`served`): every step's
    forward time times `served.factor`, `served.per_seq_s` more per sequence, and `served.gap_s` more
    per step (the intercept: the simulator starts the next step when one ends). Measured on a
    calibration load (`summary`), never on the replay being predicted."""
    k = served.factor
    line = {name: k * c for name, c in fit.coefficients_s.items()}
    line["intercept"] += served.gap_s
    line["num_seqs"] += served.per_seq_s
    return ProfiledCostModel(tuple(line.values()),
                             {n: k * v for n, v in fit.decode_corrections_s.items()},
                             {n: k * v for n, v in fit.prefill_corrections_s.items()},
                             f"{fit.cost_model.name} served", f"{fit.cost_model.description}; forward times "
                             f"x{k:.3f} plus {served.per_seq_s * 1e3:.2f} ms a sequence, and "
                             f"{served.gap_s * 1e3:.2f} ms between steps, as served")
