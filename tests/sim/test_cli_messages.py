"""What `sim run` and `sim search` tell a newcomer: why a deployment cannot run, GPUs of a spec file
by their name, errors naming the options typed (not SimConfig's fields, nor options a command
lacks), and where the files went. Deployments with tp=3 (which no Llama-2-7B split allows) are
searched without a single simulation."""
import json

import pytest

from sim import SimConfig
from sim.cli import main

SLOS = ["--slo-ttft-p99", "2", "--slo-tpot-p99", "0.2", "--workers", "1", "--no-progress"]
SPEC = """name: my-gpu
peak_tflops: 312
vector_tflops: 19.5
memory_bandwidth_gbs: 2039
memory_gib: 80
interconnect_gbs: 300
pcie_gbs: 32
num_sms: 108
"""


def search(capsys, azure_conv, *argv) -> tuple[int, str, str]:
    rc = main(["search", "--trace", str(azure_conv), "--num-requests", "20", *SLOS, *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_search_says_why_a_deployment_is_not_valid(azure_conv, capsys):
    """A tp that does not split the heads is "not valid", with the config check's reason before
    the table, once for both GPUs; short of memory stays "does not fit"."""
    rc, out, _ = search(capsys, azure_conv, "--tp", "3", "--hardware", "a100-80gb,h100")
    assert rc == 0
    note, head, *rows = out.splitlines()[:4]
    assert note.startswith("not valid (2 deployments): tp=3: llama-2-7b has 32 attention heads")
    assert all("not valid" in r and "does not fit" not in r for r in rows)
    rc, out, _ = search(capsys, azure_conv, "--model", "llama-2-70b", "--hardware", "l4")
    assert rc == 0 and "does not fit" in out and "not valid" not in out


def test_search_names_a_spec_files_gpu_and_prices_it_by_name(tmp_path, azure_conv, capsys):
    spec = tmp_path / "my.yaml"
    spec.write_text(SPEC)
    for price in ("my-gpu=1.5", f"{spec}=1.5"):
        rc, out, err = search(capsys, azure_conv, "--tp", "3", "--hardware", str(spec), "--gpu-hour-usd", price,
                              "--json", str(tmp_path / "s.json"))
        assert rc == 0, err
        row = json.loads((tmp_path / "s.json").read_text())["rows"][0]
        assert row["hardware"] == "my-gpu" and row["usd_per_hour"] == pytest.approx(3 * 1.5)
        assert out.splitlines()[2].startswith("my-gpu tp3 x1 ") and str(spec) not in out.splitlines()[2]


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


def test_run_and_search_end_with_the_files_written(tmp_path, azure_conv, capsys):
    paths = {o: str(tmp_path / n) for o, n in (("--json", "r.json"), ("--requests-csv", "r.csv"))}
    assert main(["run", "--trace", str(azure_conv), "--num-requests", "20", "--no-progress",
                 *[x for kv in paths.items() for x in kv]]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == f"written: {paths['--json']} (--json), {paths['--requests-csv']} (--requests-csv)"
    rc, out, _ = search(capsys, azure_conv, "--tp", "3", "--json", str(tmp_path / "s.json"))
    assert rc == 0 and out.splitlines()[-1] == f"written: {tmp_path / 's.json'} (--json)"
    rc, out, _ = search(capsys, azure_conv, "--tp", "3")
    assert "written" not in out
