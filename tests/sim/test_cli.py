"""The command line: run with --json, YAML configs, errors, demo."""
import json
import subprocess
import sys

import pytest

from sim.cli import main

KEYS = ("num_requests", "num_finished", "num_rejected", "simulated_time_s", "wall_time_s", "throughput_req_s",
        "output_tokens_per_s", "ttft_s", "tpot_s", "e2e_s", "prefix_cache_hit_rate", "kv_usage_mean", "kv_usage_max",
        "num_preemptions", "effective_batch_size_mean")


def test_run_writes_json(tmp_path, azure_conv, capsys):
    out = tmp_path / "out.json"
    rc = main(["run", "--trace", str(azure_conv), "--num-requests", "200", "--time-scale", "0.5", "--model",
               "llama-2-7b", "--hardware", "a100-80gb", "--tp", "1", "--replicas", "2", "--router", "least_kv",
               "--block-size", "16", "--max-num-seqs", "128", "--max-num-batched-tokens", "4096", "--policy", "sjf",
               "--preemption", "swap", "--no-prefix-caching", "--kv-cache-dtype", "fp8", "--no-fast-path",
               "--json", str(out), "--slo-ttft-s", "1", "--slo-tpot-s", "0.1", "--plot", str(tmp_path / "f.png")])
    assert rc == 0
    doc = json.loads(out.read_text())
    for k in KEYS:
        assert k in doc
    for k in ("ttft_s", "tpot_s", "e2e_s"):
        assert set(doc[k]) == {"mean", "p50", "p90", "p99"}
    assert doc["num_requests"] == 200 and doc["config"]["replicas"] == 2 and doc["config"]["fast_path"] is False
    assert doc["config"]["kv_cache_dtype"] == "fp8" and doc["config"]["enable_prefix_caching"] is False
    assert "goodput_req_s" in doc["goodput"] and (tmp_path / "f.png").stat().st_size > 10_000
    assert "ttft_s" in capsys.readouterr().out


def test_yaml_config_and_overrides(tmp_path, traces, capsys):
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(f"trace: {traces / 'sharegpt_8k_filtered_stats_llama2_tokenizer.csv'}\nnum_requests: 50\n"
                   "rate: 2.0\narrival: gamma\ncv: 3.0\nmodel: llama-3-8b\nhardware: h100\nreplicas: 2\n")
    out = tmp_path / "o.json"
    assert main(["run", "--config", str(cfg), "--replicas", "3", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["num_requests"] == 50 and doc["config"]["model"] == "llama-3-8b" and doc["config"]["replicas"] == 3
    cfg.write_text("modle: llama-2-7b\n")
    assert main(["run", "--config", str(cfg)]) == 2
    assert "modle" in capsys.readouterr().err


def test_errors_are_one_clear_line(tmp_path, azure_conv, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,x,3\n")
    assert main(["run", "--trace", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "line 2" in err and "'x'" in err
    assert main(["run", "--trace", str(azure_conv), "--model", "gpt-5"]) == 2
    assert "llama-2-7b" in capsys.readouterr().err
    assert main(["run", "--trace", str(azure_conv), "--model", "llama-2-70b", "--num-requests", "5"]) == 2
    assert "short by" in capsys.readouterr().err


def test_demo_as_make_runs_it(tmp_path):
    r = subprocess.run([sys.executable, "-m", "sim", "demo", "--num-requests", "300", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "simulated requests/s" in r.stdout and "ttft_s" in r.stdout
    assert (tmp_path / "demo.png").stat().st_size > 20_000 and (tmp_path / "summary.json").exists()


def test_bench_cases_run():
    from sim.bench import run_case

    row = run_case("synthetic", 300, True, 5.0)
    assert row["num_requests"] == 300 and row["sim_req_per_s"] > 0 and row["peak_mb"] >= row["base_mb"] > 0
    assert run_case("azure", 100, False, 5.0)["fast_path_steps"] == 0.0


def test_bench_quick_gives_the_speed_up_with_its_spread_or_says_it_is_unmeasurable(monkeypatch, capsys):
    """`sim bench --quick` printed one pair of 0.1 s runs' CPU-time ratio as the fast path's
    speed-up (1.18x once, 0.93x another time, on the same code): noise. Here the cases' CPU times
    are given: A100's runs vary about the same time, H100's stepping runs take twice as long."""
    import itertools
    import types

    import sim.bench

    cpu = {("azure", "1"): [0.12, 0.13, 0.12, 0.13, 0.12], ("azure", "0"): [0.13, 0.11, 0.14, 0.12, 0.12],
           ("azure-h100", "1"): [0.14, 0.15, 0.14, 0.13, 0.14], ("azure-h100", "0"): [0.27, 0.28, 0.26, 0.27, 0.29]}
    times = {k: iter(v) for k, v in cpu.items()}
    calls = itertools.count()

    def fake_case(argv, **_kwargs):
        name, n, fast = argv[argv.index("--case") + 1:]
        seconds = next(times[name, fast]) if name != "synthetic" else 0.5
        next(calls)
        row = {"case": name, "model": "m", "hardware": "h", "fast_path": fast == "1", "num_requests": int(n),
               "cpu_s": seconds, "sim_req_per_s": 1, "sim_req_per_cpu_s": 1, "peak_mb": 1}
        return types.SimpleNamespace(stdout=json.dumps(row) + "\n")

    monkeypatch.setattr(sim.bench.subprocess, "run", fake_case)
    assert sim.bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert ("fast path speed-up, 2,000 Azure requests on m / h: not measurable at this size: 0.85x to 1.17x over 5 "
            "runs of each (median CPU time 0.12 s stepping, 0.12 s fast)") in out
    assert ("fast path speed-up, 2,000 Azure requests on m / h: 1.93x in CPU time, 1.86x to 2.08x over 5 runs of each "
            "(median CPU time 0.27 s stepping, 0.14 s fast)") in out
    assert next(calls) == 22  # five runs of each Azure case, fast path on and off; two synthetic sizes


def test_config_file_values_are_held_to_the_options_types(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    for body, what in (('enable_prefix_caching: "false"\n', "enable_prefix_caching='false': expected true or false"),
                       ("max_num_seqs: many\n", "max_num_seqs='many': expected a value of type int")):
        bad.write_text(body)
        assert main(["run", "--config", str(bad), "--trace", "x.csv"]) == 2
        assert what in capsys.readouterr().err


def test_config_file_finds_a_trace_next_to_it(tmp_path):
    import gzip
    import json

    from sim.cli import main

    body = b"arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,3\n0.5,20,4\n"
    (tmp_path / "t.csv").write_bytes(body)
    (tmp_path / "t.csv.gz").write_bytes(gzip.compress(body))
    for name in ("t.csv", "t.csv.gz"):
        (tmp_path / "c.yaml").write_text(f"trace: {name}\nmodel: smollm2-135m\nhardware: l4\n")
        out = tmp_path / "o.json"
        assert main(["run", "--config", str(tmp_path / "c.yaml"), "--json", str(out)]) == 0
        assert json.load(open(out))["num_finished"] == 2


def test_tensor_parallelism_must_split_the_heads():
    import pytest

    from sim import get_hardware, get_model, plan_kv_cache

    with pytest.raises(ValueError, match="tp=2: smollm2-135m has 9 attention heads"):
        plan_kv_cache(get_model("smollm2-135m"), get_hardware("l4"), tp=2)


def test_config_file_errors_are_clear(tmp_path, capsys):
    """A config file's errors are usage errors (exit status 2), as the command line's are."""
    cfg = tmp_path / "c.yaml"
    for body, what in (("trace: [unclosed\n", "not valid YAML"), ("watermark: null\n", "watermark=null"),
                       ("num_gpu_blocks: 2.5\n", "num_gpu_blocks=2.5: expected an integer")):
        cfg.write_text(body)
        assert main(["run", "--config", str(cfg), "--trace", "x.csv"]) == 2
        assert what in capsys.readouterr().err
    assert main(["run", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read the config file" in capsys.readouterr().err


def test_block_size_zero_is_a_clear_error(azure_conv, capsys):
    assert main(["run", "--trace", str(azure_conv), "--block-size", "0"]) == 2
    assert "--block-size 0: expected a power of two" in capsys.readouterr().err


def test_policies_read_the_traces_columns(tmp_path, azure_conv, capsys):
    """edf needs deadlines (a trace column, or SLO targets); each policy then serves differently."""
    rows = azure_conv.read_text().splitlines()[:301]
    trace = tmp_path / "t.csv"
    lines = [rows[0] + ",priority,business_value,slo_s"]
    for i, r in enumerate(rows[1:]):
        lines.append(f"{r},{i % 3},{(i * 7) % 5},{1 + (i * 13) % 29}")
    trace.write_text("\n".join(lines) + "\n")
    common = ["--num-gpu-blocks", "600", "--time-scale", "0.2", "--no-progress"]
    assert main(["run", "--trace", str(azure_conv), "--num-requests", "50", "--policy", "edf"]) == 2
    assert "policy edf needs deadlines" in capsys.readouterr().err
    docs = {}
    for policy, extra in (("fcfs", []), ("edf", []), ("priority", []), ("priority", ["--priority-weights", "0,0,1"])):
        out = tmp_path / "o.json"
        assert main(["run", "--trace", str(trace), "--policy", policy, *extra, *common, "--json", str(out)]) == 0
        docs[policy + "".join(extra)] = json.loads(out.read_text())
    runs = {k: (d["ttft_s"]["mean"], d["num_preemptions"]) for k, d in docs.items()}
    assert len(set(runs.values())) == 4, runs
    assert docs["priority--priority-weights0,0,1"]["config"]["priority_weights"] == [0.0, 0.0, 1.0]
    out = tmp_path / "slo.json"
    assert main(["run", "--trace", str(azure_conv), "--num-requests", "50", "--policy", "edf", "--slo-ttft-s", "2",
                 "--slo-tpot-s", "0.1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["num_finished"] == 50


def test_shared_prefix_workload_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "o.json"
    common = ["run", "--shared-prefix", "4,1024,64,32", "--num-requests", "200", "--rate", "20", "--json", str(out)]
    assert main(common) == 0
    shared = json.loads(out.read_text())
    assert shared["num_finished"] == 200 and shared["workload"]["shared_prefix"] == [4, 1024, 64, 32]
    assert shared["prefix_cache_hit_rate"] > 0.85  # all but each group's first prompt hit 1024 of 1088 tokens
    assert main([*common, "--no-prefix-caching"]) == 0
    assert json.loads(out.read_text())["kv_usage_max"] > shared["kv_usage_max"]
    assert main(["run", "--shared-prefix", "4,1024,64,32", "--rate", "20"]) == 2
    assert "--num-requests" in capsys.readouterr().err
    for extra, what in ((["--num-requests", "0"], "num_requests=0"), (["--num-requests", "9", "--start-s", "5"],
                                                                       "--start-s/--duration-s select a window")):
        assert main(["run", "--shared-prefix", "4,1024,64,32", "--rate", "20", *extra]) == 2
        assert what in capsys.readouterr().err
    assert main(["run", "--shared-prefix", "4,1024,64,32", "--rate", "20", "--num-requests", "9", "--policy",
                 "edf"]) == 2
    assert "shared-prefix(G=4,P=1024) has no slo_s column" in capsys.readouterr().err


def test_a_routed_run_prints_the_pooled_lru_yardstick_beside_its_hit_rate(tmp_path, capsys, azure_conv):
    """Issue 11: the yardstick is a column beside every routing result, `sim run` included. 4 groups
    sharing 1,024-token prefixes, 300 prompts of 1,088 tokens, caches that hold everything: one
    pooled LRU hits the prefix of all but each group's first prompt (296 x 1,024 tokens), however
    the requests are routed."""
    out = tmp_path / "o.json"
    common = ["run", "--shared-prefix", "4,1024,64,32", "--num-requests", "300", "--rate", "20", "--json", str(out)]
    expected = 296 * 1024 / (300 * 1088)
    for router in ("kv_aware", "round_robin"):
        assert main([*common, "--replicas", "2", "--router", router]) == 0
        doc = json.loads(out.read_text())
        assert doc["pooled_lru_hit_rate"] == pytest.approx(expected, abs=1e-12)
        keys = list(doc)
        assert keys[keys.index("prefix_cache_hit_rate") + 1] == "pooled_lru_hit_rate"
        assert "pooled_lru_hit_rate" in capsys.readouterr().out
    for no_routing in (["--replicas", "1"], ["--replicas", "2", "--no-prefix-caching"]):
        assert main([*common, *no_routing]) == 0
        assert "pooled_lru_hit_rate" not in json.loads(out.read_text())
    assert main(["run", "--trace", str(azure_conv), "--num-requests", "50", "--replicas", "2", "--json", str(out)]) == 0
    assert "pooled_lru_hit_rate" not in json.loads(out.read_text())  # no prefix ids: nothing to route by


def test_record_itl_writes_every_latency_as_a_json_list(tmp_path, azure_conv):
    import pandas as pd

    csv = tmp_path / "r.csv"
    assert main(["run", "--trace", str(azure_conv), "--num-requests", "60", "--record-itl", "--requests-csv",
                 str(csv), "--no-progress"]) == 0
    df = pd.read_csv(csv)
    itl = [json.loads(v) for v in df.itl_s]
    assert [len(x) for x in itl] == (df.num_generated - 1).tolist() and max(map(len, itl)) > 100
    assert all(abs(sum(x) - (f - t)) < 1e-9 for x, f, t in zip(itl, df.finished_s, df.first_token_s))


def test_a_cache_aware_router_on_a_trace_without_prefix_ids_is_warned_of(azure_conv, capsys):
    """kv_aware over the Azure trace (lengths only) routed every request by load and hit nothing,
    and said nothing: a newcomer read a hit rate of 0 as the router's."""
    for router in ("kv_aware", "prefix_aware"):
        assert main(["run", "--trace", str(azure_conv), "--num-requests", "30", "--replicas", "2", "--router",
                     router]) == 0
        assert f"warning: --router {router} matches prompts by their prefix ids, and " in capsys.readouterr().err
    for argv in (["--replicas", "2", "--router", "least_outstanding"], ["--router", "kv_aware"]):
        assert main(["run", "--trace", str(azure_conv), "--num-requests", "30", *argv]) == 0
        assert "warning" not in capsys.readouterr().err
    assert main(["run", "--shared-prefix", "2,64,16,8", "--num-requests", "20", "--rate", "5", "--replicas", "2",
                 "--router", "kv_aware"]) == 0
    assert "warning" not in capsys.readouterr().err
