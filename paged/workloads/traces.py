"""Readers of trace files into plain numpy columns, with errors that name the file, the line
and the value. Formats (see traces/README.md):

- azure:    `TIMESTAMP,ContextTokens,GeneratedTokens` (absolute datetimes)
- vidur:    `arrived_at,num_prefill_tokens,num_decode_tokens` (seconds)
- mooncake: JSON lines with `timestamp` (ms), `input_length`, `output_length`, `hash_ids`
- burstgpt: BurstGPT's `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`
            (seconds); its failed requests (`Response tokens` 0: no answer came) are dropped, with a
            warning that counts them, as `vllm bench serve`'s BurstGPT loader drops them
- lengths:  `num_prefill_tokens,num_decode_tokens` (no arrival times: arrivals are synthetic)

A file whose name ends in .gz is read through gzip.

Any format may carry what the scheduling policies read, as optional columns (or JSON keys):
`priority` (an integer, lower is more urgent, as vLLM's), `business_value` (a number, the
article's c-term) and `slo_s` (seconds after arrival by which the request should finish: the
deadline `edf` serves by).
"""
from __future__ import annotations

import csv
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .csv_fast import read_plain_csv

# The repository's own traces (traces/README.md gives their sources and licenses): the simulator's
# demo, the engine's benchmark and the experiments all replay the Azure conversation trace.
REPO = Path(__file__).resolve().parents[2]
TRACES_DIR = REPO / "traces"
AZURE_CONV = TRACES_DIR / "azure_llm_2023_conv.csv"

FORMATS = ("azure", "vidur", "burstgpt", "mooncake", "lengths")
OPTIONAL_COLUMNS = ("priority", "business_value", "slo_s")
MAX_LENGTH = 2**31 - 1  # tokens: beyond this a length is a unit mistake, and int32 columns would wrap
_CSV_COLUMNS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "vidur": ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
    "lengths": ("num_prefill_tokens", "num_decode_tokens"),
}


class TraceError(ValueError):
    """A malformed trace: the message names the file, the line and the value."""


@dataclass(slots=True)
class TraceColumns:
    arrival_s: np.ndarray | None  # None for length-only traces
    num_prompt_tokens: np.ndarray
    num_output_tokens: np.ndarray
    hash_ids: list[list[int]] | None = None  # mooncake: prefix block ids per request
    priority: np.ndarray | None = None  # the OPTIONAL_COLUMNS, None when the trace has none
    business_value: np.ndarray | None = None
    slo_s: np.ndarray | None = None


def detect_format(path: str | Path) -> str:
    path = Path(path)
    if path.name.removesuffix(".gz").endswith((".jsonl", ".json")):
        return "mooncake"
    try:
        with _open_text(path) as f:
            header = [c.strip() for c in f.readline().strip().split(",")]
    except UnicodeDecodeError as e:
        raise _decode_error(path, e) from None
    except (OSError, EOFError) as e:  # gzip's errors on a file that only looks compressed
        raise TraceError(f"{path}: cannot read the trace: {e}") from None
    for fmt in ("azure", "vidur", "burstgpt", "lengths"):
        if all(c in header for c in _CSV_COLUMNS[fmt]):
            return fmt
    raise TraceError(f"{path}: cannot tell the trace format from the header {header}; expected the columns of "
                     f"one of {_CSV_COLUMNS} or a .jsonl Mooncake trace (or pass the format: {list(FORMATS)})")


def read_trace(path: str | Path, fmt: str = "auto", max_rows: int | None = None) -> TraceColumns:
    """The trace's columns. `max_rows`: only its first that many requests are read (a week-long trace's
    first thousand without reading, or holding, the week); the rows after them are not checked. Ignored
    for a length-only trace (its synthetic arrivals are drawn for the whole file) and for BurstGPT (its
    first N requests may lie past row N, failed requests being dropped)."""
    path = Path(path)
    if path.is_dir():
        raise TraceError(f"trace {path} is a directory: expected a trace file")
    if not path.is_file():
        raise FileNotFoundError(f"trace file {path} does not exist")
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt in ("lengths", "burstgpt"):
        max_rows = None
    if fmt == "mooncake":
        return _read_mooncake(path, max_rows)
    if fmt not in _CSV_COLUMNS:
        raise ValueError(f"unknown trace format {fmt!r}: known are {['auto', *FORMATS]}")
    plain = read_plain_csv(path, fmt, MAX_LENGTH, max_rows)  # the common case, without importing pandas
    return TraceColumns(*plain) if plain is not None else _read_csv(path, fmt, max_rows)


def _open_text(path: Path):
    """The file as text, gzip-compressed when its name ends in .gz; a byte-order mark (as
    spreadsheet programs write) is not part of the header."""
    if path.suffix == ".gz":
        import gzip  # here: most traces are plain text, and a run need not load zlib's modules

        return gzip.open(path, "rt", encoding="utf-8-sig")
    return open(path, encoding="utf-8-sig")


def _decode_error(path: Path, e: UnicodeDecodeError) -> TraceError:
    return TraceError(f"{path}: byte {e.start} is not UTF-8 text ({e.reason}): expected a CSV or JSON-lines "
                      "trace, plain or gzip-compressed (.gz)")


def _fail(path: Path, row: int, column: str, value, expected: str) -> TraceError:
    # Row 0 is on line 2, under the header.
    return TraceError(f"{path}, line {row + 2}: {column}={value!r}: expected {expected}")


def _lengths(path: Path, raw, column: str) -> np.ndarray:
    import pandas as pd

    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    bad = ~(np.isfinite(values) & (values >= 1) & (values <= MAX_LENGTH) & (values == np.floor(values)))
    if bad.any():
        i = int(np.argmax(bad))
        raise _fail(path, raw.index[i], column, raw.iloc[i], f"a whole number of tokens in [1, {MAX_LENGTH}]")
    return values.astype(np.int64)


def _optional(path: Path, df, column: str) -> np.ndarray | None:
    """An optional column's values (see OPTIONAL_COLUMNS), checked row by row."""
    import pandas as pd

    if column not in df.columns:
        return None
    raw = df[column]
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    for i, v in enumerate(values):
        expected = _check_optional(column, v)
        if expected:
            raise _fail(path, raw.index[i], column, raw.iloc[i], expected)
    return values.astype(np.int64) if column == "priority" else values


def _check_optional(column: str, v: float) -> str | None:
    """What an optional column's value should have been, or None when it is fine."""
    if column == "priority" and not (np.isfinite(v) and v == np.floor(v) and abs(v) < 2**31):
        return "a whole number (lower is more urgent)"
    if column == "business_value" and not np.isfinite(v):
        return "a finite number"
    if column == "slo_s" and not (np.isfinite(v) and v > 0):
        return "seconds after arrival > 0"
    return None


def _read_csv(path: Path, fmt: str, max_rows: int | None = None) -> TraceColumns:
    import pandas as pd

    columns = _CSV_COLUMNS[fmt]
    try:
        with warnings.catch_warnings():
            # pandas only warns of (and drops) a row's fields beyond the header's
            warnings.simplefilter("error", pd.errors.ParserWarning)
            df = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=False, index_col=False,
                             encoding="utf-8-sig", nrows=max_rows)
    except pd.errors.ParserWarning:
        raise _extra_fields(path) from None
    except pd.errors.ParserError as e:  # such as a JSON-lines file read as --format azure
        raise TraceError(f"{path}: {' '.join(str(e).split())}; expected a CSV trace in the {fmt} format, with the "
                         f"columns {list(columns)}") from None
    except UnicodeDecodeError as e:
        raise _decode_error(path, e) from None
    except (OSError, EOFError) as e:
        raise TraceError(f"{path}: cannot read the trace: {e}") from None
    df.columns = [str(c).strip() for c in df.columns]  # as detect_format reads the header
    # Blank lines are kept so that row i is line i + 2; only trailing ones (an editor's final
    # newlines) are dropped.
    blank = df.apply(lambda col: col.str.strip() == "").all(axis=1).to_numpy()
    keep = len(blank) - int(np.argmin(blank[::-1])) if not blank.all() else 0
    df = df.iloc[:keep]
    missing = [c for c in columns if c not in df.columns]
    if missing:
        have = list(df.columns)
        shown = f"{have}" if len(have) <= 8 else f"{str(have[:8])[:-1]}, ...] ({len(have)} in all)"
        raise TraceError(f"{path}, line 1: missing column(s) {missing}; the {fmt} format has {list(columns)}, "
                         f"the file has {shown}")
    for c in columns:
        empty = (df[c].isna() | (df[c].str.strip() == "")).to_numpy()
        if empty.any():
            i = int(np.argmax(empty))
            raise _fail(path, i, c, "", "a value (the row is missing this column)")
    arrival = None
    if fmt == "azure":
        raw = df["TIMESTAMP"]
        # utc: offsets may change within a trace (a daylight-saving switch); times without one are UTC
        ts = pd.to_datetime(raw, format="ISO8601", errors="coerce", utc=True)
        if ts.isna().any():
            i = int(np.argmax(ts.isna().to_numpy()))
            raise _fail(path, i, "TIMESTAMP", raw.iloc[i], "a datetime like 2023-11-16 18:15:46.6805900")
        arrival = (ts - ts.iloc[0]).dt.total_seconds().to_numpy(dtype=np.float64) if len(ts) else np.zeros(0)
        time_col = "TIMESTAMP"
    elif fmt in ("vidur", "burstgpt"):
        time_col = columns[0]
        raw = df[time_col]
        arrival = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
        bad = ~(np.isfinite(arrival) & (arrival >= 0))
        if bad.any():
            i = int(np.argmax(bad))
            raise _fail(path, i, time_col, raw.iloc[i], "a time in seconds >= 0")
    if arrival is not None:
        _check_order(path, arrival, df[time_col])
    if fmt == "burstgpt":
        failed = (pd.to_numeric(df["Response tokens"], errors="coerce") == 0).to_numpy()
        if failed.any():  # rows keep their labels: an error still names the file's line
            warnings.warn(f"{path}: dropped {int(failed.sum())} of {len(df)} requests whose Response tokens is 0 "
                          "(BurstGPT's failed requests: no answer came)", stacklevel=3)
            df, arrival = df[~failed], arrival[~failed]
    prompt_col, output_col = columns[-2:]
    return TraceColumns(arrival, _lengths(path, df[prompt_col], prompt_col), _lengths(path, df[output_col], output_col),
                        **{c: _optional(path, df, c) for c in OPTIONAL_COLUMNS})


def _extra_fields(path: Path) -> TraceError:
    """The first row with more fields than the header, named."""
    with _open_text(path) as f:
        rows = csv.reader(f)
        header = next(rows)
        for lineno, row in enumerate(rows, 2):
            if len(row) > len(header):
                return TraceError(f"{path}, line {lineno}: {len(row)} fields {row[:len(header) + 2]}: expected at "
                                  f"most {len(header)}, as the header {header} names")
    return TraceError(f"{path}: a row has more fields than the header {header}")


def _check_order(path: Path, arrival: np.ndarray, raw, row_offset: int = 0) -> None:
    back = np.diff(arrival) < 0
    if back.any():
        i = int(np.argmax(back)) + 1
        raise _fail(path, i + row_offset, raw.name, raw.iloc[i],
                    f"arrival times that do not go backwards (the row before has {raw.iloc[i - 1]!r})")


def _read_mooncake(path: Path, max_rows: int | None = None) -> TraceColumns:
    times, prompts, outputs, ids = [], [], [], []
    extra: dict[str, list] = {c: [] for c in OPTIONAL_COLUMNS}
    try:
        with _open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                if len(times) == max_rows:
                    break
                if line.strip():
                    _read_mooncake_line(path, lineno, line, times, prompts, outputs, ids, extra)
    except UnicodeDecodeError as e:
        raise _decode_error(path, e) from None
    except (OSError, EOFError) as e:
        raise TraceError(f"{path}: cannot read the trace: {e}") from None
    for c, values in extra.items():
        if values and len(values) != len(times):
            raise TraceError(f"{path}: {c!r} is given on {len(values)} of {len(times)} lines: give it on every "
                             "line or on none")
    return TraceColumns(np.asarray(times, dtype=np.float64) / 1000.0, np.asarray(prompts, dtype=np.int64),
                        np.asarray(outputs, dtype=np.int64), ids,
                        **{c: np.asarray(v, dtype=np.int64 if c == "priority" else np.float64) if v else None
                           for c, v in extra.items()})


def _read_mooncake_line(path: Path, lineno: int, line: str, times, prompts, outputs, ids, extra) -> None:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}, line {lineno}: not valid JSON ({e.msg}): {line.strip()[:80]!r}") from None
    if not isinstance(rec, dict):
        raise TraceError(f"{path}, line {lineno}: expected a JSON object, got {line.strip()[:80]!r}")
    for key in ("timestamp", "input_length", "output_length"):
        if key not in rec:
            raise TraceError(f"{path}, line {lineno}: missing key {key!r} (the line has {sorted(rec)})")
    t, p, o = rec["timestamp"], rec["input_length"], rec["output_length"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < 1e300:
        raise TraceError(f"{path}, line {lineno}: timestamp={t!r}: expected milliseconds >= 0")
    if times and t < times[-1]:
        raise TraceError(f"{path}, line {lineno}: timestamp={t!r}: expected arrival times that do not go "
                         f"backwards (the line before has {times[-1]!r})")
    for key, v in (("input_length", p), ("output_length", o)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_LENGTH:
            raise TraceError(f"{path}, line {lineno}: {key}={v!r}: expected a whole number of tokens in "
                             f"[1, {MAX_LENGTH}]")
    h = rec.get("hash_ids", [])
    if not isinstance(h, list) or not all(isinstance(x, int) and not isinstance(x, bool) and -2**63 <= x < 2**63
                                          for x in h):
        raise TraceError(f"{path}, line {lineno}: hash_ids={str(h)[:80]}: expected a list of 64-bit integers")
    for c in OPTIONAL_COLUMNS:
        if c in rec:
            v = rec[c]
            number = not isinstance(v, bool) and isinstance(v, (int, float)) and abs(v) < 1e300
            expected = _check_optional(c, float(v)) if number else "a number"
            if expected:
                raise TraceError(f"{path}, line {lineno}: {c}={v!r}: expected {expected}")
            extra[c].append(v)
    times.append(t)
    prompts.append(p)
    outputs.append(o)
    ids.append(h)
