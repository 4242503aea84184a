"""scripts/run_speed.py at its edges: a misspelt base checkout or a run count under 1 is one line
naming it (exit status 2), before any run, not a traceback after the first."""
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "run_speed.py"


@pytest.fixture
def run_speed(monkeypatch):
    spec = importlib.util.spec_from_file_location("run_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def fail(*_args, **_kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(module, "run_once", fail)
    return module


@pytest.mark.parametrize("argv, message", [
    (["NOPE"], "base NOPE: expected a checkout of this project (it has no traces/azure_llm_2023_conv.csv)"),
    (["-n", "0"], "-n 0: expected runs per checkout >= 1"),
])
def test_bad_arguments_are_named_before_any_run(run_speed, tmp_path, capsys, argv, message):
    argv = [str(tmp_path / "nope") if a == "NOPE" else a for a in argv]
    with pytest.raises(SystemExit) as e:
        run_speed.main(argv)
    assert e.value.code == 2
    assert message.replace("NOPE", str(tmp_path / "nope")) in capsys.readouterr().err


def test_help_says_what_it_measures_in_whole(run_speed, capsys):
    with pytest.raises(SystemExit):
        run_speed.main(["--help"])
    assert "trace loading, simulation, summary" in " ".join(capsys.readouterr().out.split())


def test_instruction_counts_run_with_a_fixed_hash_seed(run_speed, tmp_path, monkeypatch):
    """Counted with a random hash seed, the same code moved by up to 25M instructions."""
    monkeypatch.setenv("PYTHONHASHSEED", "random")
    env = run_speed.run_env(tmp_path, callgrind=True)
    assert env["PYTHONHASHSEED"] == "0" and env["OPENBLAS_NUM_THREADS"] == "1" and env["PYTHONPATH"] == str(tmp_path)
    assert run_speed.run_env(tmp_path, callgrind=False)["PYTHONHASHSEED"] == "random"  # wall clock: as a user runs it
