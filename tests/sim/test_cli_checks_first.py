"""`python -m sim search`, `calibrate` and `breakdown` at their edges, as `run` is in
test_cli_edges.py: a bad value or output path is one line naming it (exit status 2), found before
the search, the fit or the breakdown runs; and values that made the search never end (rtol <= 0)
or answer 0 for every deployment (SLOs <= 0) are refused."""
import math

import pytest

import sim.calibrate
import sim.search
from sim.cli import main
from sim.search import SearchTask
from sim.sim_config import SimConfig
from sim.slo import SLO


def usage_error(capsys, argv) -> str:
    """stderr of `python -m sim ARGV`, after checking it exited with status 2 (argparse's way or ours)."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    assert rc == 2
    return capsys.readouterr().err


@pytest.fixture
def no_search(monkeypatch):
    def fail(*_args, **_kwargs):
        raise AssertionError("search() was called")

    monkeypatch.setattr(sim.search, "search", fail)


def search(azure_conv, *argv) -> list[str]:
    return ["search", "--trace", str(azure_conv), "--num-requests", "20", "--no-progress", "--slo-ttft-p99", "1",
            "--slo-tpot-p99", "0.1", *argv]


@pytest.mark.parametrize("option, suffix", [("--json", ".json"), ("--plot", ".png")])
def test_search_output_folder_fails_before_searching(tmp_path, azure_conv, capsys, no_search, option, suffix):
    err = usage_error(capsys, search(azure_conv, option, str(tmp_path)))
    assert f"{option} {tmp_path}: is a folder; expected a file path, such as {tmp_path / ('out' + suffix)}" in err


def test_search_output_under_a_file_fails_before_searching(tmp_path, azure_conv, capsys, no_search):
    (tmp_path / "f").write_text("")
    err = usage_error(capsys, search(azure_conv, "--json", str(tmp_path / "f" / "s.json")))
    assert f"{tmp_path / 'f'} is a file, so it cannot hold s.json" in err


@pytest.mark.parametrize("option, name", [("--json", "s.json"), ("--plot", "s.png")])
def test_search_output_no_one_may_write_fails_before_searching(unwritable, azure_conv, capsys, no_search, option,
                                                               name):
    err = usage_error(capsys, search(azure_conv, option, str(unwritable / name)))
    assert f"error: {option} {unwritable / name}: cannot write it (" in err


def test_search_figure_format_and_shared_path_fail_before_searching(tmp_path, azure_conv, capsys, no_search):
    assert "matplotlib cannot write .txt files" in usage_error(
        capsys, search(azure_conv, "--plot", str(tmp_path / "p.txt")))
    same = str(tmp_path / "s.json")
    assert "--json writes the same file" in usage_error(capsys, search(azure_conv, "--json", same, "--plot", same))


@pytest.mark.parametrize("argv, message", [
    (["--rtol", "0"], "argument --rtol: '0': expected a finite number > 0"),
    (["--rtol", "-1"], "argument --rtol: '-1': expected a finite number > 0"),
    (["--slo-ttft-p99", "-2"], "argument --slo-ttft-p99: '-2': expected a finite number > 0"),
    (["--slo-tpot-p99", "0"], "argument --slo-tpot-p99: '0': expected a finite number > 0"),
    (["--workers", "0"], "--workers 0: expected at least 1"),
    (["--start-s", "-5"], "argument --start-s: '-5': expected a finite number >= 0"),
    (["--hardware", "a100-80gb,h10"], "unknown hardware 'h10': known are"),
])
def test_search_bad_values_are_named(azure_conv, capsys, no_search, argv, message):
    assert message in usage_error(capsys, search(azure_conv, *argv))


def test_search_api_refuses_what_would_never_end_or_always_miss():
    with pytest.raises(ValueError, match=r"SearchTask.rtol=0: expected a finite value > 0"):
        SearchTask(SimConfig(), SLO(1.0, 0.1), rtol=0)
    with pytest.raises(ValueError, match=r"SLO.ttft_p99_s=-2: expected seconds > 0"):
        SLO(-2, 0.1)
    with pytest.raises(ValueError, match=r"SLO.tpot_p99_s=nan: expected seconds > 0"):
        SLO(1.0, math.nan)


@pytest.mark.parametrize("argv, message", [
    (["--slo-ttft-s", "-1"], "argument --slo-ttft-s: '-1': expected a finite number > 0"),
    (["--slo-tpot-s", "0"], "argument --slo-tpot-s: '0': expected a finite number > 0"),
    (["--start-s", "-5"], "argument --start-s: '-5': expected a finite number >= 0"),
])
def test_run_goodput_targets_and_window_start_are_checked(azure_conv, capsys, argv, message):
    assert message in usage_error(capsys, ["run", "--trace", str(azure_conv), "--num-requests", "10", *argv])


def test_calibrate_checks_its_figure_path_before_fitting(tmp_path, capsys, monkeypatch):
    def fail(*_args, **_kwargs):
        raise AssertionError("calibrate() was called")

    monkeypatch.setattr(sim.calibrate, "calibrate", fail)
    assert f"--plot {tmp_path}: is a folder" in usage_error(capsys, ["calibrate", "--plot", str(tmp_path)])
    assert "matplotlib cannot write .txt files" in usage_error(capsys, ["calibrate", "--plot",
                                                                        str(tmp_path / "c.txt")])


@pytest.mark.parametrize("argv, message", [
    (["--tp", "0"], "tp=0: expected an integer >= 1"),
    (["--tp", "3"], "tp=3: llama-2-7b has 32 attention heads"),
    (["--context", "0"], "--context 0: expected tokens >= 1"),
    (["--plot", "FOLDER"], "is a folder; expected a file path"),
])
def test_breakdown_bad_values_are_named(tmp_path, capsys, argv, message):
    argv = [str(tmp_path) if a == "FOLDER" else a for a in argv]
    assert message in usage_error(capsys, ["breakdown", *argv])


def test_a_missing_profile_gets_its_error_alone(tmp_path, azure_conv, capsys):
    """Not also the warning about sizing the KV cache for a profile that is not there."""
    err = usage_error(capsys, ["run", "--trace", str(azure_conv), "--cost-model", str(tmp_path / "nope.json")])
    assert err.startswith("error: ") and "nope.json: cannot read the cost model profile" in err and "warning" not in err


@pytest.mark.parametrize("content", [None, "{not json", '{"model": "x"}'])
def test_a_swap_profile_that_cannot_be_read_is_named(tmp_path, azure_conv, capsys, content):
    path = tmp_path / "swap.json"
    if content is not None:
        path.write_text(content)
    err = usage_error(capsys, ["run", "--trace", str(azure_conv), "--preemption", "swap", "--swap-space-gib", "4",
                               "--swap-compression", "lz4", "--swap-profile", str(path)])
    assert f"error: swap profile {path}: cannot read it (" in err and "python -m paged.engine.swap_profile" in err


@pytest.mark.parametrize("body, message", [
    ("trace: x.csv\nmodel: [\n", "not valid YAML: while parsing a flow node expected the node content"),
    ("trace: x.csv\nslo_ttft_s: -1\n", "slo_ttft_s=-1: expected a finite number > 0"),
    ("trace: x.csv\nstart_s: -5\n", "start_s=-5: expected a finite number >= 0"),
    ("trace: x.csv\nnum-requests: 5\nmodle: x\n",
     "unknown option(s) ['modle', 'num-requests'] (did you mean model, num_requests?); known are"),
])
def test_config_file_errors_are_one_line_in_the_options_words(tmp_path, capsys, body, message):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(body)
    err = usage_error(capsys, ["run", "--config", str(cfg)])
    assert len(err.strip().splitlines()) == 1 and f"error: {cfg}: {message}" in err


def test_a_trace_read_in_the_wrong_format_says_which_was_expected(traces, capsys):
    """A Mooncake JSON-lines trace read as --format azure: pandas' tokenizing error alone named
    neither the format nor its columns."""
    trace = traces / "mooncake_fast25_synthetic_trace.jsonl"
    err = usage_error(capsys, ["run", "--trace", str(trace), "--format", "azure"])
    assert f"error: {trace}: Error tokenizing data" in err and len(err.strip().splitlines()) == 1
    assert "expected a CSV trace in the azure format, with the columns ['TIMESTAMP', 'ContextTokens'," in err
    # the first 5 requests read only the first 5 lines, which pandas tokenizes: their header lacks the columns
    err = usage_error(capsys, ["run", "--trace", str(trace), "--format", "azure", "--num-requests", "5"])
    assert (f"error: {trace}, line 1: missing column(s) ['TIMESTAMP', 'ContextTokens', 'GeneratedTokens']; the azure "
            "format has" in err and len(err.strip().splitlines()) == 1)
    assert "(82 in all)" in err and len(err) < 400  # its header, a JSON line split at commas, is not all repeated


def test_search_names_a_missing_trace_or_a_folder_as_run_does(tmp_path, capsys, no_search):
    for trace, message in ((tmp_path / "nope.csv", f"trace file {tmp_path / 'nope.csv'} does not exist"),
                           (tmp_path, f"trace {tmp_path} is a directory: expected a trace file")):
        assert f"error: {message}" in usage_error(capsys, search(trace))
