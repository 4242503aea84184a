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
from itertools import islice
from pathlib import Path

import numpy as np

FAST_FORMATS = {"azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
                "lengths": ("num_prefill_tokens", "num_decode_tokens")}
_TIME = re.compile(r"(\d{4}-\d\d-\d\d)[ T](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?")
_NS = 10**9


def read_plain_csv(path: Path, fmt: str, max_length: int, max_rows: int | None = None):
    """(arrival_s or None, prompt tokens, output tokens) of a plain trace, or None (see the module doc);
    of its first `max_rows` rows only, when given (the rest of the file is not read)."""
    if fmt not in FAST_FORMATS or path.suffix == ".gz":
        return None
    try:
        with path.open(encoding="utf-8-sig") as f:
            text = f.read() if max_rows is None else "".join(islice(f, max_rows + 1))
    except (OSError, UnicodeDecodeError):
        return None
    # Read in text mode, every line ends in "\n" whatever the file used ("\r\n" or "\r"): universal newlines.
    header, _, body = text.rstrip("\n").partition("\n")
    columns = FAST_FORMATS[fmt]
    n = len(columns)
    if [c.strip() for c in header.split(",")] != list(columns) or not body or not _rows_complete(body, n):
        return None
    # Every field in one list, the columns as strided slices of it: a list per row would be
    # ~20k containers the collector traverses (~10M instructions a load).
    fields = body.replace("\n", ",").split(",")
    cols = [fields[i::n] for i in range(n)]
    lengths = [_lengths(cols[i], max_length) for i in (-2, -1)]
    if lengths[0] is None or lengths[1] is None:
        return None
    arrival = _azure_seconds(cols[0]) if fmt == "azure" else None
    if fmt == "azure" and arrival is None:
        return None
    return arrival, *lengths


def _rows_complete(body: str, n: int) -> bool:
    """Whether every line of `body` has n fields: its separators, in order, are n - 1 commas then a
    newline, line after line. Checked over the bytes at once (a loop over the lines cost ~30M
    instructions a load); no byte of a multi-byte UTF-8 character is a comma or a newline."""
    b = np.frombuffer(body.encode(), dtype=np.uint8)
    seps = np.append(b[(b == ord(",")) | (b == ord("\n"))], ord("\n"))  # and the last line's end
    if len(seps) % n:
        return False
    rows = seps.reshape(-1, n)
    return bool((rows[:, :-1] == ord(",")).all() and (rows[:, -1] == ord("\n")).all())


def _lengths(values: list[str], max_length: int) -> np.ndarray | None:
    digits = "".join(values)  # every value non-empty, ASCII digits only: checked once over the column
    if not (all(values) and digits.isdigit() and digits.isascii()):
        return None
    # Parsed in C: a quarter of the cost of int() per value (~30M instructions a load). Digits only,
    # so the parse cannot stop short; a value past int64 saturates, and fails the bound below.
    out = np.fromstring(",".join(values), dtype=np.int64, sep=",")
    return out if out.min() >= 1 and out.max() <= max_length else None


def _azure_seconds(values: list[str]) -> np.ndarray | None:
    """Seconds after the first time, as pandas computes them (see the module doc)."""
    t = _fixed_layout_ns(values)
    if t is None:
        t = _row_by_row_ns(values)
        if t is None:
            return None
    if (np.diff(t) < 0).any():
        return None
    whole, residual = np.divmod(t, _NS)
    return whole + residual / _NS


_DIGITS = np.array([0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18])  # YYYY MM DD hh mm ss
_MAX_SPAN_DAYS = 100_000  # nanoseconds since the first time fit int64 well within this


def _fixed_layout_ns(values: list[str]) -> np.ndarray | None:
    """`_row_by_row_ns` for times that all have one layout and length (a trace written by one
    program), column by column in numpy; None when they do not (the row-by-row path decides)."""
    n = len(values[0])
    if not (n == 19 or 21 <= n <= 29):  # no fraction, or '.' and 1 to 9 digits
        return None
    try:
        raw = np.array(values, dtype=f"S{n + 1}")
    except UnicodeEncodeError:
        return None
    a = raw.view(np.uint8).reshape(len(values), n + 1)  # a shorter value ends in zero bytes
    if a[:, n].any():  # a longer one
        return None
    frac_cols = np.arange(20, n)
    d = a[:, np.concatenate([_DIGITS, frac_cols])].astype(np.int64) - ord("0")
    seps = a[:, [4, 7, 13, 16]] == np.frombuffer(b"--::", dtype=np.uint8)
    if not ((0 <= d) & (d <= 9)).all() or not seps.all() or not np.isin(a[:, 10], (ord(" "), ord("T"))).all() \
            or (n > 19 and not (a[:, 19] == ord(".")).all()):
        return None
    ymd = d[:, :8] @ 10 ** np.arange(7, -1, -1)  # YYYYMMDD
    h, mi, s = (d[:, i] * 10 + d[:, i + 1] for i in (8, 10, 12))
    if (h > 23).any() or (mi > 59).any() or (s > 59).any():
        return None
    days, where = np.unique(ymd, return_inverse=True)
    try:
        ordinals = np.array([date(int(v) // 10000, int(v) // 100 % 100, int(v) % 100).toordinal() for v in days])
    except ValueError:
        return None
    day = ordinals[where.reshape(-1)] - ordinals[where.reshape(-1)[0]]
    if np.abs(day).max() > _MAX_SPAN_DAYS:
        return None
    frac = np.zeros(len(values), dtype=np.int64)
    for j in range(len(frac_cols)):  # the fraction's digits, scaled as ljust(9, "0") scales them
        frac += d[:, 14 + j] * 10 ** (8 - j)
    ns = (((day * 24 + h) * 60 + mi) * 60 + s) * _NS + frac
    return ns - ns[0]


def _row_by_row_ns(values: list[str]) -> np.ndarray | None:
    """Nanoseconds after the first time, row by row: any layout the module doc allows."""
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
    return np.array([x - first for x in ns], dtype=np.int64)
