"""Reading a well-formed Azure or length-only CSV trace without pandas: a third of `python -m sim
run`'s start-up was importing pandas to parse three columns.

Only the plain case is read here: exactly the format's columns, every row complete, lengths as
digits, Azure times as `YYYY-MM-DD HH:MM:SS[.fraction]` without an offset (UTC, as pandas takes
them), arrivals in order. Anything else returns None and `paged.workloads.traces` reads the file with pandas,
whose path names the line and the value at fault. The columns are those pandas' path gives, bit
for bit: arrival seconds are split into whole seconds plus nanoseconds / 1e9 as pandas'
`total_seconds` splits them.
"""
from __future__ import annotations

import re
from datetime import date
from pathlib import Path

import numpy as np

FAST_FORMATS = {"azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
                "lengths": ("num_prefill_tokens", "num_decode_tokens")}
_TIME = re.compile(r"(\d{4}-\d\d-\d\d)[ T](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?")
_NS = 10**9


def read_plain_csv(path: Path, fmt: str, max_length: int):
    """(arrival_s or None, prompt tokens, output tokens) of a plain trace, or None (see the module doc)."""
    if fmt not in FAST_FORMATS or path.suffix == ".gz":
        return None
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return None
    lines = text.rstrip("\r\n").split("\n")
    columns = FAST_FORMATS[fmt]
    if [c.strip() for c in lines[0].rstrip("\r").split(",")] != list(columns) or len(lines) < 2:
        return None
    rows = [line.rstrip("\r").split(",") for line in lines[1:]]
    if any(len(r) != len(columns) for r in rows):
        return None
    lengths = [_lengths([r[i] for r in rows], max_length) for i in (-2, -1)]
    if lengths[0] is None or lengths[1] is None:
        return None
    arrival = _azure_seconds([r[0] for r in rows]) if fmt == "azure" else None
    if fmt == "azure" and arrival is None:
        return None
    return arrival, *lengths


def _lengths(values: list[str], max_length: int) -> np.ndarray | None:
    if not all(v.isdigit() and v.isascii() for v in values):
        return None
    out = np.array([int(v) for v in values], dtype=np.int64)
    return out if out.min() >= 1 and out.max() <= max_length else None


def _azure_seconds(values: list[str]) -> np.ndarray | None:
    """Seconds after the first time, as pandas computes them (see the module doc)."""
    days: dict[str, int] = {}
    ns = []
    for v in values:
        m = _TIME.fullmatch(v)
        if m is None:
            return None
        day, hh, mm, ss, frac = m.groups()
        if day not in days:
            try:
                days[day] = date.fromisoformat(day).toordinal()
            except ValueError:
                return None
        h, mi, s = int(hh), int(mm), int(ss)
        if h > 23 or mi > 59 or s > 59:
            return None
        ns.append(((days[day] * 24 + h) * 60 + mi) * 60 * _NS + s * _NS + (int(frac.ljust(9, "0")) if frac else 0))
    first = ns[0]
    if ns[-1] - first >= 2**63:
        return None
    t = np.array([x - first for x in ns], dtype=np.int64)
    if (np.diff(t) < 0).any():
        return None
    whole, residual = np.divmod(t, _NS)
    return whole + residual / _NS
