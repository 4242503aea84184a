"""Trace loaders, malformed rows, transforms and synthetic workloads."""
import json

import numpy as np
import pytest

from paged.workloads.traces import detect_format
from paged.workloads.workload import select
from sim import TraceError, load_workload, sample_lengths, shared_prefix_workload, synthetic_arrivals


def test_real_traces_load_with_their_documented_facts(traces):
    conv = load_workload(traces / "azure_llm_2023_conv.csv")
    assert len(conv) == 19366 and conv.arrival_s[0] == 0.0
    assert 3500 < conv.arrival_s[-1] < 3510  # 5.5 req/s over 3,502 s
    assert round(conv.num_prompt_tokens.mean()) == 1155 and round(conv.num_output_tokens.mean()) == 211
    moon = load_workload(traces / "mooncake_fast25_synthetic_trace.jsonl")
    assert len(moon) == 3993 and moon.hash_id_block_size == 512
    ids = moon.prefix_ids(0)
    assert len(ids) == -(-int(moon.num_prompt_tokens[0]) // 512)
    lengths = load_workload(traces / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv", rate=2.0)
    assert len(lengths) == 30731 and lengths.prefix_index is None
    assert detect_format(traces / "azure_llm_2023_code.csv") == "azure"


def test_vidur_format(tmp_path):
    p = tmp_path / "v.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n1.5,10,3\n2.0,20,4\n2.0,5,1\n")
    w = load_workload(p)
    assert w.arrival_s.tolist() == [0.0, 0.5, 0.5] and w.num_prompt_tokens.tolist() == [10, 20, 5]


BURST = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def test_burstgpt_format_drops_failed_requests_and_says_so(tmp_path):
    """BurstGPT's own columns (seconds, two models, API and conversation logs); a failed request (Response
    tokens 0) never got an answer, so it cannot be replayed: dropped, counted in a warning."""
    p = tmp_path / "BurstGPT_1.csv"
    p.write_text(BURST + "5,ChatGPT,472,18,490,Conversation log\n45,ChatGPT,1087,0,1087,Conversation log\n"
                 "118,GPT-4,417,276,693,Conversation log\n140,ChatGPT,1360,107,1467,API log\n")
    assert detect_format(p) == "burstgpt"
    with pytest.warns(UserWarning, match=r"BurstGPT_1.csv: dropped 1 of 4 requests whose Response tokens is 0"):
        w = load_workload(p)
    assert w.arrival_s.tolist() == [0.0, 113.0, 135.0]
    assert w.num_prompt_tokens.tolist() == [472, 417, 1360] and w.num_output_tokens.tolist() == [18, 276, 107]
    # a bad row after a dropped one is still named by its line in the file
    p.write_text(BURST + "5,ChatGPT,472,0,472,API log\n6,ChatGPT,abc,3,3,API log\n")
    with pytest.raises(TraceError, match=r"line 3: Request tokens='abc'"), pytest.warns(UserWarning):
        load_workload(p)
    p.write_text(BURST + "5,ChatGPT,472,4,476,API log\n4,ChatGPT,10,3,13,API log\n")
    with pytest.raises(TraceError, match=r"line 3: Timestamp='4': expected arrival times that do not go backwards"):
        load_workload(p)


@pytest.mark.parametrize("name", ["azure_llm_2023_conv.csv", "mooncake_fast25_synthetic_trace.jsonl"])
def test_the_first_n_requests_read_only_the_first_n_rows(tmp_path, traces, name):
    """--num-requests N reads N rows of a timed trace, not the file (a week-long trace's first thousand
    requests took 14 s and 2.4 GB for 3M rows): the same requests as reading it all, and a broken row
    after them is never reached."""
    full = load_workload(traces / name)
    for n in (1, 7, 500):
        got = load_workload(traces / name, num_requests=n, time_scale=0.5, max_model_len=4096)
        want = select(full, num_requests=n, time_scale=0.5, max_model_len=4096)
        for field in ("arrival_s", "num_prompt_tokens", "num_output_tokens"):
            assert np.array_equal(getattr(got, field), getattr(want, field)), (n, field)
        if full.prefix_index is not None:
            assert [got.prefix_ids(i) for i in range(n)] == [want.prefix_ids(i) for i in range(n)]
    lines = (traces / name).read_text().splitlines(keepends=True)
    header = 1 if name.endswith(".csv") else 0
    broken = tmp_path / name
    broken.write_text("".join(lines[:header + 10]) + "garbage\n" + "".join(lines[header + 10:]))
    assert len(load_workload(broken, num_requests=10)) == 10
    with pytest.raises(TraceError, match=f"line {header + 11}"):
        load_workload(broken, num_requests=11)
    with pytest.raises(TraceError, match=f"line {header + 11}"):  # a time window reads the whole trace
        load_workload(broken, num_requests=10, start_s=1.0)


AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:15:46.6805900,374,44\n"


@pytest.mark.parametrize("body, where, what", [
    (AZ + ROW + "2023-11-16 18:15:47.0,12\n", "line 3", "GeneratedTokens"),  # missing column
    (AZ + ROW + "2023-11-16 18:15:47.0,abc,4\n", "line 3", "'abc'"),  # not a number
    (AZ + ROW + "2023-11-16 18:15:47.0,-5,4\n", "line 3", "'-5'"),  # negative length
    (AZ + ROW + "2023-11-16 18:15:47.0,5,0\n", "line 3", "'0'"),  # zero length
    (AZ + ROW + "2023-11-16 18:15:45.0,5,3\n", "line 3", "backwards"),  # time goes backwards
    (AZ + ROW + "yesterday,5,3\n", "line 3", "'yesterday'"),
    (AZ + ROW + ROW.strip() + ",7\n", "line 3", "fields"),  # an extra column
    ("TIMESTAMP,ContextTokens\n" + "2023-11-16 18:15:46.6,3\n", "line 1", "GeneratedTokens"),
    (AZ + ROW + "2023-11-16 18:15:47.0,1e20,4\n", "line 3", "'1e20'"),  # would wrap in int64
    (AZ.strip() + ",slo_s\n" + ROW.strip() + ",2\n" + ROW.strip() + ",0\n", "line 3", "slo_s='0'"),
    (AZ.strip() + ",priority\n" + ROW.strip() + ",1.5\n", "line 2", "priority='1.5'"),
])
def test_malformed_azure_rows_name_file_line_and_value(tmp_path, body, where, what):
    p = tmp_path / "bad.csv"
    p.write_text(body)
    with pytest.raises(TraceError) as e:
        load_workload(p, "azure")
    assert str(p) in str(e.value) and where in str(e.value) and what in str(e.value)


@pytest.mark.parametrize("line, what", [
    ('{"timestamp": 5, "input_length": 10}', "output_length"),
    ('{"timestamp": 5, "input_length": "x", "output_length": 3}', "input_length='x'"),
    ('{"timestamp": 5, "input_length": 0, "output_length": 3}', "input_length=0"),
    ('{"timestamp": 1, "input_length": 4, "output_length": 3}', "backwards"),
    ('{"timestamp": 5, "input_length": 4, "output_length": 3, "hash_ids": "a"}', "hash_ids"),
    ("not json", "not valid JSON"),
    ('{"timestamp": Infinity, "input_length": 4, "output_length": 3}', "timestamp=inf"),
    ('{"timestamp": 1' + "0" * 400 + ', "input_length": 4, "output_length": 3}', "timestamp=1000"),
    ('{"timestamp": 5, "input_length": 99999999999999999999999, "output_length": 3}', "input_length=9999"),
    ('{"timestamp": 5, "input_length": 4, "output_length": 3, "hash_ids": [99999999999999999999999]}', "64-bit"),
    ('{"timestamp": 5, "input_length": 4, "output_length": 3, "business_value": "high"}', "business_value='high'"),
])
def test_malformed_mooncake_lines(tmp_path, line, what):
    p = tmp_path / "bad.jsonl"
    good = json.dumps({"timestamp": 2, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]})
    p.write_text(good + "\n" + line + "\n")
    with pytest.raises(TraceError) as e:
        load_workload(p)
    assert str(p) in str(e.value) and "line 2" in str(e.value) and what in str(e.value)


def test_unknown_format_lists_known(tmp_path, traces):
    with pytest.raises(ValueError, match="azure.*vidur.*burstgpt.*mooncake.*lengths"):
        load_workload(traces / "azure_llm_2023_conv.csv", "parquet")
    p = tmp_path / "odd.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="cannot tell the trace format"):
        load_workload(p)


def test_length_only_trace_needs_a_rate(traces):
    with pytest.raises(ValueError, match="--rate"):
        load_workload(traces / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv")


def test_transforms(azure_conv):
    w = load_workload(azure_conv)
    head = w.head(100)
    assert len(head) == 100
    half = head.scale_time(0.5)  # twice the load
    assert np.allclose(half.arrival_s, head.arrival_s * 0.5)
    win = w.window(100.0, 200.0)
    assert win.arrival_s[0] == 0.0 and win.arrival_s[-1] < 100.0
    assert len(win) == np.count_nonzero((w.arrival_s >= 100) & (w.arrival_s < 200))
    capped = w.cap_lengths(4096)
    over = (w.num_prompt_tokens >= 4096) | (w.num_prompt_tokens + w.num_output_tokens > 4096)
    assert capped.num_capped == over.sum() > 0
    assert (capped.num_prompt_tokens + capped.num_output_tokens <= 4096).all()
    opts = load_workload(azure_conv, start_s=100.0, duration_s=100.0, num_requests=50, time_scale=2.0,
                         max_model_len=4096)
    assert len(opts) == 50 and np.allclose(opts.arrival_s, win.head(50).arrival_s * 2.0)


def test_synthetic_arrivals_rates_and_burstiness():
    n = 200_000
    for process, cv in (("poisson", 1.0), ("gamma", 4.0), ("constant", 0.0)):
        t = synthetic_arrivals(n, 10.0, process, cv if cv else 1.0, 0)
        gaps = np.diff(t)
        assert t[0] == 0.0 and abs(gaps.mean() - 0.1) < 0.005
        assert abs(gaps.std() / gaps.mean() - cv) < 0.1 * max(cv, 1)
    assert np.array_equal(synthetic_arrivals(100, 3.0, "gamma", 2.0, 7), synthetic_arrivals(100, 3.0, "gamma", 2.0, 7))
    with pytest.raises(ValueError, match="poisson"):
        synthetic_arrivals(10, 1.0, "weibull")


def test_shared_prefix_and_sampled_lengths(azure_conv):
    w = shared_prefix_workload(10, num_groups=2, prefix_tokens=100, suffix_tokens=20, output_tokens=5, rate=1.0)
    assert w.prefix_ids(0) == w.prefix_ids(2) != w.prefix_ids(1)
    assert len(w.prefix_ids(0)) == 100 // 16 and (w.num_prompt_tokens == 120).all()
    p, o = sample_lengths(load_workload(azure_conv), 1000, seed=3)
    assert len(p) == len(o) == 1000 and p.min() >= 1


def test_trailing_blank_lines_and_spaced_headers_are_read(tmp_path):
    from sim import read_trace

    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                     "2023-11-16 18:15:50.9951690,396,109\n\n\n")
    assert list(read_trace(azure).num_prompt_tokens) == [374, 396]
    vidur = tmp_path / "v.csv"
    vidur.write_text("arrived_at , num_prefill_tokens , num_decode_tokens\n0.5,10,3\n1.0,20,4\n")
    assert list(read_trace(vidur).num_output_tokens) == [3, 4]


def test_gzip_and_byte_order_marks_are_read(tmp_path, traces):
    import gzip

    src = (traces / "mooncake_fast25_synthetic_trace.jsonl").read_bytes()[:20_000].rsplit(b"\n", 1)[0]
    (tmp_path / "m.jsonl.gz").write_bytes(gzip.compress(src))
    (tmp_path / "m.jsonl").write_bytes(src)
    a, b = load_workload(tmp_path / "m.jsonl.gz"), load_workload(tmp_path / "m.jsonl")
    assert len(a) == len(b) > 3 and np.array_equal(a.arrival_s, b.arrival_s) and a.prefix_ids(2) == b.prefix_ids(2)
    bom = tmp_path / "bom.csv"  # as spreadsheet programs write: the header must still say "vidur"
    bom.write_bytes(b"\xef\xbb\xbfarrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,3\n0.5,20,4\n")
    assert detect_format(bom) == "vidur" and load_workload(bom).arrival_s.tolist() == [0.0, 0.5]
    fake = tmp_path / "fake.csv"  # compressed, but not named so
    fake.write_bytes(gzip.compress(b"arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,3\n"))
    with pytest.raises(TraceError, match=f"{fake}: byte 1 is not UTF-8"):
        load_workload(fake)
    with pytest.raises(TraceError, match="is a directory"):
        load_workload(tmp_path)


def test_azure_timestamps_without_fractions_or_with_changing_offsets(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text(AZ + "2023-11-16 18:15:46,10,5\n2023-11-16 18:15:47.25,10,5\n")
    assert load_workload(p).arrival_s.tolist() == [0.0, 1.25]
    p.write_text(AZ + "2023-10-29 01:59:00+01:00,10,5\n2023-10-29 01:00:30+00:00,10,5\n")  # a DST switch
    assert load_workload(p).arrival_s.tolist() == [0.0, 90.0]


def test_policy_columns_are_read_and_deadlines_move_with_their_requests(tmp_path):
    p = tmp_path / "v.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens,priority,business_value,slo_s\n"
                 "1.0,10,3,2,0.5,4\n2.0,20,4,0,1.5,1\n")
    w = load_workload(p)
    assert w.priority.tolist() == [2, 0] and w.business_value.tolist() == [0.5, 1.5]
    assert w.deadline_s.tolist() == [4.0, 2.0]  # arrival (rebased to 0) + slo_s
    slow = w.scale_time(3.0)  # arrivals spread out, each keeps its SLO
    assert slow.arrival_s.tolist() == [0.0, 3.0] and slow.deadline_s.tolist() == [4.0, 4.0]
    slo = w.with_slo_deadlines(ttft_s=0.5, tpot_s=0.25)
    assert slo.deadline_s.tolist() == [0.5 + 0.25 * 2, 1.0 + 0.5 + 0.25 * 3]


def test_a_trace_longer_than_the_clock_is_refused(tmp_path):
    from sim import SimConfig, Workload, simulate

    p = tmp_path / "v.csv"  # microseconds read as seconds
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,3\n10000000,20,4\n")
    config = SimConfig(model="smollm2-135m", hardware="l4")
    with pytest.raises(ValueError, match="arrivals until 1e\\+07 s"):
        simulate(load_workload(p), config)
    late = Workload(np.array([1e7, 1e7 + 1]), np.array([10, 20]), np.array([3, 4]))  # a short span, late
    with pytest.raises(ValueError, match="arrivals until 1e\\+07 s"):
        simulate(late, config)
