"""What `sim run` and `sim search` tell a newcomer: errors naming the options typed (not SimConfig's
fields, nor options a command lacks)."""
import pytest

from sim import SimConfig
from sim.cli import main

SLOS = ["--slo-ttft-p99", "2", "--slo-tpot-p99", "0.2", "--workers", "1", "--no-progress"]


@pytest.mark.parametrize("command", [["search", *SLOS], ["run"]])
def test_no_workload_names_only_options_the_command_has(capsys, command):
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "give one of --trace PATH" in err and "--shared-prefix" in err
    assert ("--config" in err) == (command == ["run"])


@pytest.mark.parametrize("command, argv, message", [
    ("search", ["--router", "kv-aware", *SLOS], "--router kv-aware: expected one of ["),
    ("run", ["--kv-events-interval-s", "-1"], "--kv-events-interval-s -1.0: expected seconds in [0, "),
    ("run", ["--cache-threshold=2"], "--cache-threshold 2.0: expected a number in [0, 1]"),
])
def test_config_errors_name_the_option(azure_conv, capsys, command, argv, message):
    assert main([command, "--trace", str(azure_conv), "--num-requests", "10", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "SimConfig." not in err


def test_a_config_files_bad_value_is_named_by_its_key(tmp_path, azure_conv, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("kv_events_interval_s: -1\n")
    assert main(["run", "--config", str(cfg), "--trace", str(azure_conv)]) == 2
    assert f"{cfg}: kv_events_interval_s=-1.0: expected seconds" in capsys.readouterr().err


def test_python_callers_still_read_the_field():
    with pytest.raises(ValueError, match=r"SimConfig.router='kv-aware': expected one of"):
        SimConfig(router="kv-aware")
