"""`paged bench serve`: prompts that share what the trace says they share, a summary under the
simulator's keys, and errors counted when the server fails mid-run."""
from __future__ import annotations

import json
import signal
import threading

import httpx
import numpy as np
import pandas as pd
import pytest

from paged.serve.bench_serve import build_parser, main, sampling_fields, summarize
from paged.serve.prompts import PromptMaker
from paged.serve.replay import FINISHED, GREEDY, Records, request_body
from paged.workloads.workload import Workload, shared_prefix_workload
from sim.cli import main as sim_main

from .conftest import REPO, metric, start_router, wait_router, wait_until

AZURE_CONV = REPO / "traces" / "azure_llm_2023_conv.csv"
MOONCAKE = REPO / "traces" / "mooncake_fast25_synthetic_trace.jsonl"  # prompts of tens of thousands of tokens

# what the simulator's --json and the load generator's both report, with the same meaning
SHARED_KEYS = ("num_requests", "num_finished", "throughput_req_s", "input_tokens_per_s", "output_tokens_per_s",
               "wall_time_s", "ttft_s", "tpot_s", "e2e_s", "itl_s", "goodput", "num_capped", "prefix_cache_hit_rate")


def test_prompts_share_real_tokens_where_the_trace_shares_ids():
    ids = np.array([7, 8, 9, 7, 8, 5], dtype=np.int64)  # request 0: 7 8 9; request 1: 7 8 5
    w = Workload(np.array([0.0, 1.0, 2.0]), np.array([40, 36, 20]), np.array([4, 4, 4]), prefix_index=np.array(
        [0, 1, -1]), prefix_values=ids, prefix_offsets=np.array([0, 3, 6]), hash_id_block_size=16)
    make = PromptMaker(w, vocab_size=500, min_token_id=100, seed=3)
    a, b, c = make(0), make(1), make(2)
    assert [len(a), len(b), len(c)] == [40, 36, 20]
    assert a[:32] == b[:32] and a[32:36] != b[32:36]  # ids 7, 8 shared; 9 and 5 differ
    assert all(100 <= t < 500 for t in a + b + c)
    assert a == PromptMaker(w, 500, 100, seed=3)(0) and a != PromptMaker(w, 500, 100, seed=4)(0)

    groups = shared_prefix_workload(4, 2, 32, 8, 4, rate=10.0, hash_id_block_size=16)
    make = PromptMaker(groups, 32000, 1000)
    p = [make(i) for i in range(4)]
    assert p[0][:32] == p[2][:32] and p[0][:32] != p[1][:32] and p[0][32:] != p[2][32:]


def test_every_key_it_prints_is_documented():
    """It prints "(every key: docs/summary_keys.md)", as `sim run` does: so the keys of its own are there too."""
    rec = Records(1)
    rec.status[:] = FINISHED
    rec.scheduled_s[:], rec.sent_s[:], rec.first_token_s[:], rec.finished_s[:] = 0.0, 0.01, 0.1, 0.3
    rec.num_generated[:] = 3
    summary = summarize(Workload(np.array([0.0]), np.array([10]), np.array([3])), rec, 0.3, 1.0, 0.1)
    doc = (REPO / "docs" / "summary_keys.md").read_text()
    keys = [k for k, v in summary.items() for k in (k, *(v if k == "goodput" else ()))]
    missing = [k for k in keys if f"`{k}`" not in doc]
    assert not missing, f"docs/summary_keys.md does not explain {missing}"


def test_summary_has_the_simulators_keys(backends, tmp_path, capsys):
    """Also: two processes share the replay (--workers 2), and their records merge into one."""
    azure_conv = AZURE_CONV
    (url, _), = backends(["b0"], "--token-delay-s", "0.002")
    out, csv = tmp_path / "bench.json", tmp_path / "requests.csv"
    assert main(["--url", url, "--trace", str(azure_conv), "--num-requests", "12", "--time-scale", "0.05",
                 "--max-model-len", "600", "--slo-ttft-s", "5", "--slo-tpot-s", "1", "--json", str(out),
                 "--requests-csv", str(csv), "--no-progress", "--workers", "2"]) == 0
    doc = json.loads(out.read_text())
    sim_out = tmp_path / "sim.json"
    assert sim_main(["run", "--trace", str(azure_conv), "--num-requests", "12", "--slo-ttft-s", "5",
                     "--slo-tpot-s", "1", "--json", str(sim_out)]) == 0
    sim_doc = json.loads(sim_out.read_text())
    capsys.readouterr()
    for key in SHARED_KEYS:
        assert key in doc and key in sim_doc, key
        if isinstance(sim_doc[key], dict):
            assert set(doc[key]) == set(sim_doc[key]), key
    assert doc["num_finished"] == 12 and doc["num_errors"] == 0
    assert set(doc["send_lateness_s"]) == {"mean", "p50", "p90", "p99", "max"}
    rows = pd.read_csv(csv)
    assert len(rows) == 12 and (rows.status == "finished").all() and rows.sent_s.notna().all()
    assert (np.diff(rows.arrival_s) >= 0).all()  # the schedule is the trace's, whoever sent each request
    assert (rows.num_generated == rows.num_output_tokens).all()  # ignore_eos and max_tokens: the trace's lengths
    assert (rows.num_prompt_tokens <= 599).all() and doc["workload"]["trace"] == str(azure_conv)
    # the fake server reports half of each prompt cached; with no router in front, no backend is named
    assert (rows.prefix_hit_tokens == rows.num_prompt_tokens // 2).all() and rows.backend.isna().all()
    # the summary's hit rate is the same tokens in sum (the simulator's key had no measured counterpart)
    assert doc["prefix_cache_hit_rate"] == pytest.approx(rows.prefix_hit_tokens.sum() / rows.num_prompt_tokens.sum())


def test_no_hit_rate_where_no_answer_reported_cached_tokens():
    """A server whose usage has no cached tokens hit nothing that we know of: NaN (printed `-`,
    JSON null), not 0."""
    rec = Records(2)
    rec.status[:] = FINISHED
    rec.scheduled_s[:], rec.sent_s[:], rec.first_token_s[:], rec.finished_s[:] = 0.0, 0.01, 0.1, 0.3
    workload = Workload(np.array([0.0, 0.1]), np.array([10, 30]), np.array([3, 3]))
    assert np.isnan(summarize(workload, rec, 0.3)["prefix_cache_hit_rate"])
    rec.cached_tokens[1] = 15  # only what was reported counts: request 0's prompt is not in the denominator
    assert summarize(workload, rec, 0.3)["prefix_cache_hit_rate"] == 0.5


def test_requests_are_capped_to_the_context_the_server_publishes(server, model_name, tmp_path, capsys):
    """Mooncake's prompts run past the tiny server's 512 tokens: every one was refused (HTTP 400).
    Capped to the max_model_len its /v1/models publishes, as sim run caps to the model's, all
    finish and num_capped counts them; --no-cap sends them whole, as sim run's does."""
    assert server.get("/v1/models").json()["data"][0]["max_model_len"] == 512
    argv = ["--url", server.url, "--trace", str(MOONCAKE), "--num-requests", "3", "--time-scale", "0.001",
            "--vocab-size", "256", "--min-token-id", "0", "--no-progress"]
    out = tmp_path / "capped.json"
    assert main([*argv, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["num_finished"] == 3 and doc["num_errors"] == 0 and doc["num_capped"] == 3
    assert doc["config"]["max_model_len"] == 512
    out = tmp_path / "whole.json"
    assert main([*argv, "--no-cap", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["num_errors"] == 3 and doc["num_capped"] == 0 and doc["config"]["max_model_len"] is None
    capsys.readouterr()


def test_a_server_that_publishes_no_context_is_sent_requests_uncapped_and_told(backends, tmp_path, capsys):
    (url, _), = backends(["b0"])
    out = tmp_path / "bench.json"
    assert main(["--url", url, "--trace", str(MOONCAKE), "--num-requests", "2", "--time-scale", "0.001",
                 "--no-progress", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["num_finished"] == 2 and doc["num_capped"] == 0 and doc["config"]["max_model_len"] is None
    err = capsys.readouterr().err
    assert err.count("publishes no max_model_len on /v1/models: requests are sent uncapped") == 1


def test_requests_csv_names_the_backend_a_router_chose(backends, procs, tmp_path, capsys):
    """Through a round_robin router over two backends, shared by two worker processes: each row has
    the backend that answered (the router's `x-paged-backend`), half of them each. (Not alternating in
    the order sent: the router alternates in the order requests reach it, which two loaded worker
    processes may swap.)"""
    started = backends(["b0", "b1"], "--token-delay-s", "0.002")
    urls = [u for u, _ in started]
    url, proc = start_router(procs, urls, "round_robin")
    wait_router(procs, url, proc, urls)
    csv = tmp_path / "requests.csv"
    assert main(["--url", url, "--shared-prefix", "2,64,16,4", "--num-requests", "8", "--rate", "4", "--arrival",
                 "constant", "--requests-csv", str(csv), "--no-progress", "--workers", "2"]) == 0
    capsys.readouterr()
    rows = pd.read_csv(csv)
    assert (rows.status == "finished").all() and (rows.prefix_hit_tokens == rows.num_prompt_tokens // 2).all()
    assert rows.backend.value_counts().to_dict() == {urls[0]: 4, urls[1]: 4}, rows.backend.tolist()


def test_errors_are_counted_when_the_server_dies_mid_run(backends, procs, tmp_path, capsys):
    """The server is killed once a few requests have finished: every request ends, finished or
    as an error, and the summary counts both."""
    (url, proc), = backends(["b0"], "--token-delay-s", "0.005")
    out = tmp_path / "bench.json"
    result = {}
    bench = threading.Thread(target=lambda: result.setdefault("code", main([
        "--url", url, "--shared-prefix", "2,64,16,8", "--num-requests", "40", "--rate", "20", "--arrival",
        "constant", "--json", str(out), "--no-progress", "--model", "fake-model"])))
    bench.start()
    try:
        wait_until(lambda: (metric(httpx.get(f"{url}/metrics", timeout=5).text, "vllm:request_success_total")
                            or 0) >= 3, "three requests finished")
        procs.stop(proc, signal.SIGKILL)
    finally:
        bench.join(120)
    assert result["code"] == 0
    doc = json.loads(out.read_text())
    assert doc["num_finished"] >= 3 and doc["num_errors"] > 0
    assert doc["num_finished"] + doc["num_errors"] == doc["num_requests"] == 40
    assert sum(doc["errors"].values()) <= doc["num_errors"]  # the ten most common messages
    assert "error x" in capsys.readouterr().out


def test_requests_are_greedy_unless_told_as_vllm_bench_serve_sends_them():
    """A server samples at temperature 1 when a request names none; vllm bench serve sends 0 unless
    told, and so does this load generator: its --temperature, --top-p and --top-k go into every body."""
    parser = build_parser()
    given = parser.parse_args(["--url", "http://x", "--shared-prefix", "1,16,16,4"])
    assert sampling_fields(given, parser) == GREEDY == {"temperature": 0.0}
    body = json.loads(request_body("m", [5, 6], 3, sampling_fields(given, parser)))
    assert body["temperature"] == 0.0 and body["max_tokens"] == 3 and body["ignore_eos"] and body["stream"]
    told = parser.parse_args(["--url", "http://x", "--shared-prefix", "1,16,16,4", "--temperature", "0.7",
                              "--top-p", "0.9", "--top-k", "-1"])
    sent = json.loads(request_body("m", [5], 1, sampling_fields(told, parser)))
    assert {k: sent[k] for k in ("temperature", "top_p", "top_k")} == {"temperature": 0.7, "top_p": 0.9, "top_k": -1}


@pytest.mark.parametrize("option, value", [("--temperature", "-0.5"), ("--temperature", "inf"), ("--top-p", "0"),
                                           ("--top-p", "1.5"), ("--top-k", "-2")])
def test_bad_sampling_options_stop_the_run_naming_the_value(option, value, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["--url", "http://127.0.0.1:9", "--shared-prefix", "1,16,16,4", option, value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"{option} {float(value) if option != '--top-k' else int(value)}" in err and "expected" in err
