"""The config search: its answer is a measured bracket (the bottom meets the SLOs, the top
misses them, within the tolerance), the same rows on one process, a pool and Ray, and
deployments that cannot run are reported, not crashed."""
import json
import math

import pytest

from sim import SimConfig, load_workload, simulate
from sim.cli import main
from sim.search import SearchTask, max_rate, search
from sim.slo import SLO

SLO_ = SLO(ttft_p99_s=1.0, tpot_p99_s=0.1)


@pytest.fixture(scope="module")
def workload():
    from paged.workloads.traces import AZURE_CONV

    return load_workload(AZURE_CONV, num_requests=150, max_model_len=4096)


def test_answer_is_a_measured_bracket(workload):
    """Re-running at the answer meets the SLOs, at the bracket's top misses them, and the two
    are within rtol: the search's claim, checked with runs of its own."""
    task = SearchTask(SimConfig(max_num_seqs=32), SLO_, rtol=0.05)
    r = max_rate(workload, task)
    assert r["max_qps"] > 0 and r["bracket_hi"] <= r["max_qps"] * 1.05
    assert SLO_.met_by(simulate(workload.at_rate(r["max_qps"]), task.config).summary())
    assert not SLO_.met_by(simulate(workload.at_rate(r["bracket_hi"]), task.config).summary())


def test_unreachable_slo_gives_zero(workload):
    """A TTFT target below one prefill is missed at any rate: the answer is 0, not a crash."""
    r = max_rate(workload, SearchTask(SimConfig(), SLO(ttft_p99_s=1e-6, tpot_p99_s=1.0), max_steps=2))
    assert r["max_qps"] == 0.0


def test_rows_in_order_serial_and_pool_alike_and_infeasible_reported(workload):
    configs = [SimConfig(model="llama-2-70b", hardware="a100-80gb"), SimConfig(replicas=2, max_num_seqs=32),
               SimConfig(max_num_seqs=32)]
    serial = search(workload, configs, SLO_, rtol=0.1, workers=1)
    pool = search(workload, configs, SLO_, rtol=0.1, workers=2)
    assert serial.equals(pool)
    assert list(serial.feasible) == [False, True, True] and "does not fit" in serial.reason[0]
    assert math.isnan(serial.max_qps[0]) and list(serial.replicas) == [1, 2, 1]
    assert serial.max_qps[1] > serial.max_qps[2]  # two replicas serve more than one
    assert serial.qps_per_gpu[1] == pytest.approx(serial.max_qps[1] / 2)
    assert serial.usd_per_hour[1] == pytest.approx(2 * 40.966 / 8)


def test_cli_writes_table_json_and_figure(tmp_path, capsys):
    from paged.workloads.traces import AZURE_CONV

    out = tmp_path / "s.json"
    rc = main(["search", "--trace", str(AZURE_CONV), "--num-requests", "100", "--hardware", "a100-80gb,h100",
               "--max-num-seqs", "32", "--slo-ttft-p99", "1", "--slo-tpot-p99", "0.1", "--rtol", "0.1",
               "--gpu-hour-usd", "h100=2.5", "--workers", "1", "--no-progress", "--json", str(out),
               "--plot", str(tmp_path / "p.png")])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert [r["hardware"] for r in doc["rows"]] == ["a100-80gb", "h100"]
    assert doc["rows"][1]["usd_per_hour"] == 2.5 and doc["slo"] == {"ttft_p99_s": 1.0, "tpot_p99_s": 0.1}
    assert "qps_per_usd_hour" in capsys.readouterr().out
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_pareto_front_and_prices():
    """The front keeps the points nothing beats on both cost and throughput; prices name
    hardware by any alias and refuse what is not a positive price."""
    from sim.prices import gpu_hour_usd, parse_prices
    from sim.search_report import pareto_front

    assert pareto_front([1, 1, 2, 3, 4, math.nan], [5, 6, 6, 7, 2, 9]) == [1, 3]
    assert parse_prices("a100=1.5, h100=2") == {"a100-80gb": 1.5, "h100": 2.0}
    assert gpu_hour_usd("h100", {"h100": 2.0}) == 2.0 and math.isnan(gpu_hour_usd("h200"))
    for bad in ("h100", "h100=-1", "h100=x"):
        with pytest.raises(ValueError, match="HARDWARE=PRICE"):
            parse_prices(bad)


def test_length_only_trace_gets_poisson_arrivals(traces, tmp_path):
    """A trace without timestamps is searched at Poisson arrivals, rescaled like any other."""
    out = tmp_path / "s.json"
    assert main(["search", "--trace", str(traces / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"),
                 "--num-requests", "100", "--slo-ttft-p99", "1", "--slo-tpot-p99", "0.1", "--rtol", "0.1",
                 "--workers", "1", "--no-progress", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["rows"][0]["max_qps"] > 0
