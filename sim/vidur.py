"""Reading Vidur's measured operator profiles (`profiles/vidur/README.md` says what a row is).

A profile folder is either one model on one GPU (a folder holding `mlp.csv`) or Vidur's tree
`<root>/<gpu>/<org>/<model>/mlp.csv`, where the GPU and the model are found by name: the GPU by
`VIDUR_GPUS`, the model by its Hugging Face id (the catalog's aliases), case-insensitively.

What the simulator takes from `mlp.csv` is, per tensor-parallel degree and profiled token count,
one layer's non-attention time on one GPU: the sum of the operators' medians but `emb`, as Vidur's
own predictor sums them (the embedding gather is not a layer's, and only one GPU of the group runs
it). A shape listed twice is averaged. The rows must be of the model's shape (heads, KV heads,
hidden size, MLP size): a profile of another model would otherwise pass silently. Vidur's older
per-GPU files (`data/profiling/a100/mlp.csv`) hold several models' rows: the model's are taken.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .hardware import HardwareSpec, get_hardware
from .models import ModelSpec, get_model

LAYER_OPS = ("attn_pre_proj", "attn_rope", "attn_post_proj", "input_layernorm", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tokens", "num_tensor_parallel_workers")
VIDUR_GPUS = {"a100-80gb": "a100"}  # Vidur's folder name where it is not the catalog's


@dataclass(slots=True, frozen=True)
class LayerProfile:
    """One layer's measured non-attention seconds on one GPU, per tensor-parallel degree:
    `tokens[tp]` (ascending) and `seconds[tp]` beside them; `ops[tp][op]` the operators apart."""

    path: Path
    tokens: dict[int, np.ndarray]
    seconds: dict[int, np.ndarray]
    ops: dict[int, dict[str, np.ndarray]]

    def at(self, tp: int, num_tokens) -> np.ndarray:
        """Interpolated between profiled token counts, linearly; past the largest, in proportion to the
        tokens (the time per token is constant there, and the last two rows are too close to take a
        slope from their noise); below the smallest, the smallest's time."""
        if tp not in self.tokens:
            raise ValueError(f"{self.path}: no rows with num_tensor_parallel_workers={tp}: profiled are "
                             f"{sorted(self.tokens)}")
        x, y = self.tokens[tp], self.seconds[tp]
        n = np.asarray(num_tokens, dtype=np.float64)
        return np.where(n > x[-1], y[-1] * n / x[-1], np.interp(n, x, y))


def find_profile(root: str | Path, model: str | ModelSpec, hardware: str | HardwareSpec) -> Path:
    """The `mlp.csv` for `model` on `hardware` under `root` (see the module doc)."""
    root = Path(root)
    if (root / "mlp.csv").is_file():
        return root / "mlp.csv"
    if not root.is_dir():
        raise FileNotFoundError(f"vidur profiles {str(root)!r}: no such folder (expected a folder with mlp.csv, or "
                                "Vidur's <gpu>/<org>/<model>/mlp.csv tree)")
    m, hw = get_model(model), get_hardware(hardware)
    gpu = VIDUR_GPUS.get(hw.name, hw.name)
    ids = {a.lower() for a in (m.name, *m.aliases)}
    found = [p for p in sorted(root.glob("*/*/*/mlp.csv"))
             if p.parts[-4].lower() == gpu and "/".join(p.parts[-3:-1]).lower() in ids]
    if not found:
        have = sorted("/".join(p.parts[-4:-1]) for p in root.glob("*/*/*/mlp.csv"))
        raise FileNotFoundError(f"vidur profiles {str(root)!r}: none for model {m.name!r} (Hugging Face id one of "
                                f"{sorted(ids - {m.name})}) on GPU {gpu!r}; found {have}")
    return found[0]


def _read_rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        raise FileNotFoundError(f"vidur profile {str(path)!r}: cannot read it: {e.strerror}") from None


class ShapeMismatch(ValueError):
    """A profile's rows are not of the model's shape (a profile of another model)."""

    def __init__(self, path: Path, model: ModelSpec, shapes: list[tuple[int, ...]]) -> None:
        expected = (model.num_heads, model.num_kv_heads, model.hidden_size, model.intermediate_size)
        self.shapes = (f"rows of shape (n_head, n_kv_head, n_embd, n_expanded_embd) {shapes}: expected "
                       f"{model.name}'s {expected}")
        super().__init__(f"vidur profile {str(path)!r}: {self.shapes}")


def _numbers(path: Path, rows: list[dict[str, str]], columns) -> np.ndarray:
    try:
        return np.array([[float(r[c]) for c in columns] for r in rows], dtype=np.float64).reshape(len(rows), -1)
    except ValueError as e:
        raise ValueError(f"vidur profile {str(path)!r}: {e}: expected numbers in {list(columns)}") from None


def read_layer_profile(path: str | Path, model: str | ModelSpec | None = None) -> LayerProfile:
    """`mlp.csv` at `path`: the rows of `model`'s shape when one is given (an error if there are none),
    else all its rows, which must then be of one shape."""
    path = Path(path)
    rows = _read_rows(path)
    wanted = (*SHAPE_COLUMNS, *(f"time_stats.{op}.median" for op in LAYER_OPS))
    missing = [c for c in wanted if not rows or c not in rows[0]]
    if missing:
        raise ValueError(f"vidur profile {str(path)!r}: missing column(s) {missing}: expected Vidur's mlp.csv "
                         f"({', '.join(SHAPE_COLUMNS)} and time_stats.<op>.median for {', '.join(LAYER_OPS)})")
    shape_of_row = [tuple(int(v) for v in row) for row in _numbers(path, rows, SHAPE_COLUMNS[:4])]
    shapes = sorted(set(shape_of_row))
    if model is not None:  # only its rows are read: another model's may lack an operator (phi-2 its second norm)
        m = get_model(model)
        expected = (m.num_heads, m.num_kv_heads, m.hidden_size, m.intermediate_size)
        if expected not in shapes:
            raise ShapeMismatch(path, m, shapes)
        rows = [r for r, shape in zip(rows, shape_of_row, strict=True) if shape == expected]
    elif len(shapes) > 1:
        raise ValueError(f"vidur profile {str(path)!r}: rows of {len(shapes)} shapes (n_head, n_kv_head, n_embd, "
                         f"n_expanded_embd) {shapes}: expected one, or the model to take the rows of")
    table = _numbers(path, rows, wanted)
    tokens, seconds, ops = {}, {}, {}
    for tp in np.unique(table[:, 5]).astype(int):
        sub = table[table[:, 5] == tp]
        n = np.unique(sub[:, 4])
        per_op = np.array([sub[sub[:, 4] == k, 6:].mean(axis=0) for k in n]) / 1000  # ms -> s
        tokens[int(tp)] = n
        seconds[int(tp)] = per_op.sum(axis=1)
        ops[int(tp)] = dict(zip(LAYER_OPS, per_op.T, strict=True))
    return LayerProfile(path, tokens, seconds, ops)


ATTENTION_COLUMNS = ("n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers", "batch_size",
                     "prefill_chunk_size", "kv_cache_size", "is_prefill", "time_stats.attn_prefill.median",
                     "time_stats.attn_decode.median")


def read_attention_profile(path: str | Path, model: str | ModelSpec, tp: int) -> tuple[float, ...]:
    """One layer's attention on one GPU of `tp`, from Vidur's attention.csv, as seconds per unit of the
    cost model's features (intercept, prefill tokens, prefill attention pairs, decode tokens, decode
    context sum). A line, not an interpolation: within a fast-path window attention must be a line in
    the context sum for the closed form to stay exact (`sim.window`). A decode row of `batch_size`
    sequences with `kv_cache_size` tokens each has that many decode tokens and their product as context;
    a prefill row, one chunk of `prefill_chunk_size` tokens after `kv_cache_size`: chunk * kv +
    chunk * (chunk + 1) / 2 pairs. Fitted by non-negative least squares of the relative error, and
    with `attn_kv_cache_save` (writing the new tokens' KV) added where the file has it."""
    from .profiled import relative_nnls

    path, m = Path(path), get_model(model)
    rows = _read_rows(path)
    missing = [c for c in ATTENTION_COLUMNS if not rows or c not in rows[0]]
    if missing:
        raise ValueError(f"vidur profile {str(path)!r}: missing column(s) {missing}: expected Vidur's attention.csv "
                         f"({', '.join(ATTENTION_COLUMNS)})")
    shape = (m.hidden_size, m.num_heads, m.num_kv_heads, tp)
    X, t = [], []
    try:
        for r in rows:
            if tuple(int(float(r[c])) for c in ATTENTION_COLUMNS[:4]) != shape:
                continue
            b, chunk, kv = (int(float(r[c])) for c in ("batch_size", "prefill_chunk_size", "kv_cache_size"))
            prefill = r["is_prefill"].strip().lower() == "true"
            seconds = float(r[f"time_stats.attn_{'prefill' if prefill else 'decode'}.median"])
            seconds += float(r.get("time_stats.attn_kv_cache_save.median") or 0.0)
            X.append([1, chunk, chunk * kv + chunk * (chunk + 1) // 2, 0, 0] if prefill else [1, 0, 0, b, b * kv])
            t.append(seconds / 1000)
    except ValueError as e:
        raise ValueError(f"vidur profile {str(path)!r}: {e}: expected numbers in {list(ATTENTION_COLUMNS)}") from None
    if len(t) < 5:
        raise ValueError(f"vidur profile {str(path)!r}: {len(t)} rows of shape (n_embd, n_q_head, n_kv_head, "
                         f"num_tensor_parallel_workers) {shape}: expected at least 5 to fit attention")
    return tuple(float(c) for c in relative_nnls(np.array(X, dtype=np.float64), np.array(t)))
