"""The pandas-free reader of plain CSV traces gives pandas' columns bit for bit, and leaves anything
irregular to the pandas path (whose errors name the line and the value)."""
from datetime import datetime

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from paged.workloads.csv_fast import _fixed_layout_ns, _row_by_row_ns, read_plain_csv
from paged.workloads.traces import MAX_LENGTH, TraceError, _read_csv, read_trace


@pytest.mark.parametrize("name", ["azure_llm_2023_conv.csv", "azure_llm_2023_code.csv"])
def test_same_columns_as_pandas(traces, name):
    path = traces / name
    plain = read_plain_csv(path, "azure", MAX_LENGTH)
    assert plain is not None
    slow = _read_csv(path, "azure")
    for got, want in zip(plain, (slow.arrival_s, slow.num_prompt_tokens, slow.num_output_tokens), strict=True):
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_irregular_files_go_to_pandas(tmp_path):
    p = tmp_path / "t.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.6805900,374,44",
            "2023-11-16 18:15:50.9951690,396,109"]
    p.write_text("\n".join(rows) + "\n")
    assert read_plain_csv(p, "azure", MAX_LENGTH)[0].tolist() == [0.0, 4.314579]
    for bad in (rows[:2] + ["2023-11-16 18:15:50+01:00,396,109"],  # an offset: pandas converts it
                rows[:2] + ["2023-11-16 18:15:40,396,109"],  # backwards
                rows[:2] + ["2023-11-16 18:15:50,396.5,109"],  # not a whole number
                rows[:2] + ["2023-11-16 18:15:50,,109"],  # an empty length
                rows[:2] + ["2023-11-16 18:15:50,396,\uff11\uff10\uff19"],  # digits, but not ASCII ones
                rows[:2] + ["2023-11-16 18:15:50,396,109,7"],  # a field too many
                rows[:2] + ["2023-11-16 18:15:50,396"],  # a field short
                rows[:1] + ["2023-11-16 18:15:46,374,44,2023-11-16 18:15:50", "396,109"],  # as many fields, in
                # the wrong rows
                rows[:2] + ["2023-11-16 18:15:50,396,99999999999999999999999"],  # past int64
                [rows[0] + ",priority", rows[1] + ",1", rows[2] + ",2"]):  # an optional column
        p.write_text("\n".join(bad) + "\n")
        assert read_plain_csv(p, "azure", MAX_LENGTH) is None
    p.write_text("\n".join(rows[:2] + ["2023-11-16 18:15:50,0,109"]) + "\n")
    with pytest.raises(TraceError, match=r"line 3: ContextTokens='0': expected a whole number"):
        read_trace(p)


@pytest.mark.parametrize("newline", ["\r\n", "\r"])
def test_windows_and_old_mac_line_ends_read_as_plain_ones(traces, tmp_path, newline):
    """The file is read in text mode (universal newlines): "\r\n" and "\r" lines give the columns "\n" ones do."""
    lines = (traces / "azure_llm_2023_conv.csv").read_text().splitlines()[:40]
    plain, other = tmp_path / "lf.csv", tmp_path / "other.csv"
    plain.write_bytes(("\n".join(lines) + "\n").encode())
    other.write_bytes((newline.join(lines) + newline).encode())
    want, got = read_plain_csv(plain, "azure", MAX_LENGTH), read_plain_csv(other, "azure", MAX_LENGTH)
    assert want is not None and got is not None
    assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))


@given(st.lists(st.tuples(st.datetimes(datetime(2000, 1, 1), datetime(2030, 12, 31)), st.integers(0, 9),
                          st.sampled_from(" T")), min_size=1, max_size=30),
       st.integers(0, 9))
def test_column_wise_times_equal_row_by_row(times, digits):
    """Times of one layout are read column by column; times of mixed layouts (some with fewer
    fraction digits, another separator) fall back to the row-by-row reading, never to another answer."""
    values = []
    for t, own_digits, sep in times:
        frac = f"{t.microsecond:06d}{t.microsecond % 997:03d}"[:digits if own_digits else own_digits]
        values.append(t.strftime(f"%Y-%m-%d{sep}%H:%M:%S") + (f".{frac}" if frac else ""))
    fast, rows = _fixed_layout_ns(values), _row_by_row_ns(values)
    if fast is not None:
        assert rows is not None and fast.dtype == rows.dtype and np.array_equal(fast, rows)
    else:  # valid times of one length: the column-wise reading takes them
        assert len({len(v) for v in values}) > 1
