"""The command line at its edges: every bad value, path or file is a usage error (exit status 2)
with one line naming the value, what was expected and where; outputs are checked before a
long run starts, so that its results are never lost to a bad path after it."""
import pytest

import sim.cli.commands
import sim.runner
from sim.cli import main


@pytest.fixture
def no_simulation(monkeypatch):
    """simulate() fails the test if called: the error must come before any simulated time."""
    def fail(*_args, **_kwargs):
        raise AssertionError("simulate() was called")

    monkeypatch.setattr(sim.runner, "simulate", fail)


def run(capsys, *argv) -> str:
    """`python -m sim run ARGV`'s stderr, after checking it exited with status 2."""
    assert main(["run", *argv]) == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("option", ["--json", "--requests-csv", "--timeseries-csv", "--plot"])
def test_an_output_path_that_is_a_folder_fails_before_simulating(tmp_path, azure_conv, capsys, no_simulation,
                                                                  option):
    err = run(capsys, "--trace", str(azure_conv), option, str(tmp_path))
    assert f"{option} {tmp_path}: is a folder; expected a file path" in err


def test_an_output_path_under_a_file_fails_before_simulating(tmp_path, azure_conv, capsys, no_simulation):
    (tmp_path / "f").write_text("")
    err = run(capsys, "--trace", str(azure_conv), "--json", str(tmp_path / "f" / "out.json"))
    assert f"{tmp_path / 'f'} is a file, so it cannot hold out.json" in err


def test_two_outputs_on_one_path_fail_before_simulating(tmp_path, azure_conv, capsys, no_simulation):
    err = run(capsys, "--trace", str(azure_conv), "--json", str(tmp_path / "o"), "--plot", str(tmp_path / "o"))
    assert "--plot" in err and "--json writes the same file" in err


def test_a_figure_format_matplotlib_cannot_write_fails_before_simulating(tmp_path, azure_conv, capsys,
                                                                         no_simulation):
    err = run(capsys, "--trace", str(azure_conv), "--plot", str(tmp_path / "figure.txt"))
    assert "matplotlib cannot write .txt files; expected one of" in err and "'png'" in err


@pytest.mark.parametrize("option", ["--json", "--plot"])
@pytest.mark.parametrize("under", [".", "new"])
def test_an_output_path_no_one_may_write_fails_before_simulating(unwritable, azure_conv, capsys, no_simulation,
                                                                 option, under):
    """Tried, not asked of os.access, which lets root write anywhere: the run then lost its results."""
    path = unwritable / under / f"out{'.json' if option == '--json' else '.png'}"
    err = run(capsys, "--trace", str(azure_conv), option, str(path))
    assert f"error: {option} {path}: cannot write it (" in err and len(err.strip().splitlines()) == 1


def test_an_output_path_ending_in_a_slash_fails_before_simulating(tmp_path, azure_conv, capsys, no_simulation):
    """The user meant a folder: a file named as the folder was written."""
    path = f"{tmp_path / 'new'}/"
    err = run(capsys, "--trace", str(azure_conv), "--json", path)
    assert (f"--json {path}: ends in a slash, so it names a folder; expected a file path, such as "
            f"{tmp_path / 'new' / 'out.json'}") in err
    assert not (tmp_path / "new").exists()


def test_a_write_that_fails_after_the_run_names_its_option(unwritable, azure_conv, capsys, monkeypatch):
    """Checked first, but a disk may fill during a run: the error names the option, not just the path."""
    monkeypatch.setattr(sim.cli.commands, "check_output_paths", lambda args: None)
    path = unwritable / "out.json"
    err = run(capsys, "--trace", str(azure_conv), "--num-requests", "20", "--no-progress", "--json", str(path))
    assert f"error: --json {path}: cannot write it (" in err and len(err.strip().splitlines()) == 1


def test_every_output_creates_its_folder(tmp_path, azure_conv):
    """As --json and --plot always did, so do the CSVs."""
    paths = {opt: tmp_path / opt.strip("-") / "new" / f"x.{ext}" for opt, ext in
             (("--json", "json"), ("--requests-csv", "csv"), ("--timeseries-csv", "csv"))}
    assert main(["run", "--trace", str(azure_conv), "--num-requests", "20", "--no-progress",
                 *[str(x) for kv in paths.items() for x in kv]]) == 0
    assert all(p.stat().st_size > 0 for p in paths.values())


@pytest.mark.parametrize("argv, message", [
    (["--shared-prefix", "2,10,10,5", "--rate", "1", "--arrival", "gamma", "--cv", "1e300"],
     "cv=1e+300: expected a coefficient of variation of the gaps in [1e-06, 1e+06]"),
    (["--shared-prefix", "2,10,10,5", "--rate", "1", "--arrival", "gamma", "--cv", "1e-300"],
     "cv=1e-300: expected a coefficient of variation"),
    (["--shared-prefix", "2,10,10,0", "--rate", "1"], "GROUPS,PREFIX,SUFFIX,OUTPUT=2,10,10,0: expected"),
    (["--trace", "AZURE", "--step-overhead-s", "1e300"], "--step-overhead-s 1e+300: expected seconds in"),
    (["--trace", "AZURE", "--bandwidth-efficiency", "1e-300"], "--bandwidth-efficiency 1e-300: expected"),
    (["--trace", "AZURE", "--time-scale", "inf"], "time_scale=inf: expected a finite value > 0"),
    (["--trace", "AZURE", "--rate", "3"], "rate=3.0: AZURE has arrival times"),
    (["--trace", "AZURE", "--static-batching", "--max-num-seqs", "2"],
     "--static-batch-size 8 (its default): expected at most max_num_seqs (2) with static_batching"),
])
def test_bad_values_are_named(azure_conv, capsys, no_simulation, argv, message):
    argv = [str(azure_conv) if a == "AZURE" else a for a in argv]
    err = run(capsys, "--num-requests", "10", *argv)
    assert message.replace("AZURE", str(azure_conv)) in err


def test_a_garbage_cost_model_file_is_named(tmp_path, azure_conv, capsys):
    """simulate() reads it first thing, before any simulated time."""
    garbage = tmp_path / "profile.json"
    garbage.write_bytes(b"\x7fELF\xd0\xff\x00")
    err = run(capsys, "--trace", str(azure_conv), "--cost-model", str(garbage))
    assert f"{garbage}: byte 4 is not UTF-8 text" in err
    assert f"{tmp_path}: cannot read the cost model profile" in run(capsys, "--trace", str(azure_conv),
                                                                     "--cost-model", str(tmp_path))


def test_a_csv_row_with_extra_fields_is_named(tmp_path, capsys):
    """pandas would drop the extra field with a warning and carry on."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,3,7\n1,20,4\n")
    err = run(capsys, "--trace", str(trace))
    assert f"{trace}, line 2: 4 fields" in err and "expected at most 3" in err


def test_settings_that_would_exhaust_memory_are_refused(azure_conv, capsys, monkeypatch):
    """Estimated from what a block and a sample take, against (here) 1 GiB available."""
    import sim.host_memory

    monkeypatch.setattr(sim.host_memory, "available_bytes", lambda: 2**30)
    err = run(capsys, "--trace", str(azure_conv), "--num-requests", "50", "--num-gpu-blocks", "100000000")
    assert "num_gpu_blocks=100,000,000 x 1 replica(s) would take about 11.9 GiB" in err
    err = run(capsys, "--trace", str(azure_conv), "--num-requests", "50", "--timeseries-interval-s", "1e-9")
    assert "timeseries_interval_s=1e-09: the run lasts at least" in err and "expected an interval of at least" in err
    assert main(["run", "--trace", str(azure_conv), "--num-requests", "50", "--num-gpu-blocks", "1000"]) == 0


def test_a_time_series_too_fine_for_requests_all_at_t0_is_refused(monkeypatch):
    """Arrivals span nothing, yet the run lasts as long as its steps: one per output token at
    least, each no shorter than the cost model's intercept (2 ms here): 2,000 x 2 ms."""
    import numpy as np

    import sim.host_memory
    from sim import CostModel, SimConfig, Workload, simulate

    monkeypatch.setattr(sim.host_memory, "available_bytes", lambda: 2**30)
    w = Workload(np.zeros(10), np.full(10, 100), np.full(10, 2000))
    cost = CostModel([(0.002, 1e-5, 0.0, 1e-5, 0.0, 0.0)])
    with pytest.raises(ValueError, match=r"timeseries_interval_s=1e-07: the run lasts at least 4 s"):
        simulate(w, SimConfig(timeseries_interval_s=1e-7, cost_model=cost))


def test_a_run_longer_than_foreseen_keeps_a_bounded_time_series(monkeypatch):
    """A cost model without an intercept lets the memory check foresee almost no run time; the
    time series then keeps every second sample, doubling its interval as often as it must,
    and warns, instead of exhausting memory. The requests' results do not depend on sampling."""
    import numpy as np

    import sim.host_memory
    from sim import CostModel, SimConfig, Workload, simulate
    from sim.host_memory import BYTES_PER_SAMPLE

    per_token = CostModel([(0.0, 1e-4, 0.0, 1e-4, 0.0, 0.0)])
    w = Workload(np.zeros(20), np.full(20, 1000), np.full(20, 300))
    config = SimConfig(cost_model=per_token, num_gpu_blocks=4000, replicas=2, timeseries_interval_s=0.001)
    monkeypatch.setattr(sim.host_memory, "available_bytes",
                        lambda: 2 * (4000 * 2 * sim.host_memory.BYTES_PER_BLOCK + 100 * 2 * BYTES_PER_SAMPLE))
    with pytest.warns(RuntimeWarning, match="keeps one every 0.016 s instead"):
        bounded = simulate(w, config)
    ts = bounded.timeseries
    assert all(40 < n <= 100 for n in ts.groupby("replica").size())
    for _, t in ts.groupby("replica").time_s:
        np.testing.assert_allclose(t.to_numpy(), np.arange(len(t)) * 0.016)
    assert t.iloc[-1] <= bounded.summary()["simulated_time_s"] < t.iloc[-1] + 0.016
    monkeypatch.undo()
    fine = simulate(w, config)
    assert len(fine.timeseries) > 1000 and fine.requests.equals(bounded.requests)


def test_the_command_line_says_when_it_coarsened_the_time_series(azure_conv, capsys, monkeypatch, tmp_path):
    """The run completes and writes its outputs; stderr says which interval the series kept."""
    import pandas as pd

    import sim.host_memory

    monkeypatch.setattr(sim.runner, "min_run_s", lambda *_args: 0.0)  # an estimate the run outlasts
    monkeypatch.setattr(sim.host_memory, "available_bytes",
                        lambda: 2 * (7609 * sim.host_memory.BYTES_PER_BLOCK + 50 * sim.host_memory.BYTES_PER_SAMPLE))
    out = tmp_path / "ts.csv"
    assert main(["run", "--trace", str(azure_conv), "--num-requests", "50", "--timeseries-interval-s", "0.01",
                 "--num-gpu-blocks", "7609", "--timeseries-csv", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: the time series would have outgrown half of this machine's memory" in err
    assert 25 < len(pd.read_csv(out)) <= 50


def test_a_pipe_as_an_output_path_is_not_opened_before_the_run(tmp_path):
    """`--json >(jq .)` names a pipe (/dev/fd/N). Trying the write opened it: with no reader yet
    that waits forever, and with one, closing it ended the reader's input before any output. A
    path that exists and is not a file is asked (os.access), not opened."""
    import os
    import threading

    from paged.output_paths import check_output_paths

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    done = threading.Event()
    checker = threading.Thread(target=lambda: (check_output_paths([("--json", str(fifo), ".json")]), done.set()),
                               daemon=True)
    checker.start()
    checker.join(timeout=5)
    unblocked = done.is_set()
    if not unblocked:  # release the check blocked in open(): a reader
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        checker.join(timeout=5)
    assert unblocked, "the check opened the pipe and waited for a reader"
