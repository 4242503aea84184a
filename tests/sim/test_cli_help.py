"""What a newcomer reads: every option has help and shows its default, every summary key is
explained in docs/summary_keys.md, and the printed summary says what is easily misread."""
import argparse
import json
import re
from pathlib import Path

import numpy as np
import pytest

from paged.metrics_summary import format_summary
from sim import SimConfig, Workload, simulate
from sim.cli import main
from sim.cli.options import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "summary_keys.md"


def test_every_option_has_help_and_shows_its_default(capsys):
    parser, _ = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        if name == "bench":  # its own parser: sim.bench
            continue
        for action in sub._actions:
            assert action.help, f"python -m sim {name}: {action.option_strings or action.dest} has no help"
        with pytest.raises(SystemExit):
            main([name, "--help"])
        out = re.sub(r"\s+", " ", capsys.readouterr().out)
        assert "(default: None)" not in out and "(default: )" not in out and "(default: [" not in out, name
        assert not re.search(r"\(default[^)]*\) \(default", out), f"{name}: a default shown twice"
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert "most requests in one step (default: 256)" in out
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    assert "(default: a100-80gb)" in re.sub(r"\s+", " ", capsys.readouterr().out)


def test_every_summary_key_is_documented():
    doc = DOC.read_text()
    result = simulate(Workload(np.array([0.0, 0.5]), np.array([100, 200]), np.array([5, 1])), SimConfig())
    keys = [*result.summary(), *result.goodput(1.0, 0.1)]
    missing = [k for k in keys if f"`{k}`" not in doc]
    assert not missing, f"docs/summary_keys.md does not explain {missing}"
    recorded = simulate(Workload(np.array([0.0]), np.array([10]), np.array([3])), SimConfig(record_itl=True))
    columns = [*recorded.requests.columns, *recorded.timeseries.columns]
    missing = [c for c in columns if f"`{c}`" not in doc]
    assert not missing, f"docs/summary_keys.md does not explain the CSV columns {missing}"


def test_the_printed_summary_says_what_capping_did():
    text = format_summary({"num_requests": 10, "num_capped": 3, "busy_fraction": 0.5})
    assert "num_capped                   3  # requests cut to fit max_model_len" in text
    assert "not GPU utilisation" in text and "docs/summary_keys.md" in text
    assert "#" not in format_summary({"num_capped": 0}).splitlines()[0]


def test_a_profiled_cost_model_on_an_unmatched_gpu_is_warned_of(tmp_path, azure_conv, capsys):
    """A CPU profile's step times with an A100's KV capacity describe no real deployment."""
    from .test_cost_model import write_profile

    profile = tmp_path / "p.json"
    write_profile(profile, (1e-3, 1e-6, 0.0, 1e-5, 0.0, 1e-5))
    argv = ["run", "--trace", str(azure_conv), "--num-requests", "10", "--cost-model", str(profile)]
    assert main(argv) == 0
    assert "warning: step times come from the profile" in capsys.readouterr().err
    assert main([*argv, "--num-gpu-blocks", "500", "--model", "HuggingFaceTB/SmolLM2-135M"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_profile_of_another_model_is_warned_of_with_the_options_to_match_it(tmp_path, azure_conv, capsys):
    """The warning named the KV sizing only: a SmolLM2 profile run with --model left at llama-2-7b went
    unremarked. It names the profile's model and cache (when recorded: older profiles lack the size,
    and still load) and the options that simulate the profiled engine."""
    from .test_cost_model import write_profile

    old = tmp_path / "old.json"
    write_profile(old, (1e-3, 1e-6, 0.0, 1e-5, 0.0, 1e-5))
    new = tmp_path / "new.json"
    new.write_text(json.dumps({**json.loads(old.read_text()), "num_gpu_blocks": 1456}))
    argv = ["run", "--trace", str(azure_conv), "--num-requests", "10"]
    assert main([*argv, "--cost-model", str(new)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert f"profile {new} of smollm2-135m (1,456 KV blocks), but --model is llama-2-7b and the KV cache" in err
    assert "to simulate the profiled engine: --model smollm2-135m --num-gpu-blocks 1456" in err
    assert main([*argv, "--cost-model", str(old), "--num-gpu-blocks", "500"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "of smollm2-135m (its KV cache not recorded), but --model is llama-2-7b;" in err
    assert err.endswith("to simulate the profiled engine: --model smollm2-135m")
    assert main([*argv, "--cost-model", str(old), "--model", "smollm2-135m"]) == 0
    assert "--num-gpu-blocks N (the profiled engine printed it)" in capsys.readouterr().err


def test_gpu_cost_models_size_the_kv_cache_without_a_warning(azure_conv, capsys):
    """The default (calibrated) and measured GPU profiles describe the --hardware GPU itself."""
    assert main(["run", "--trace", str(azure_conv), "--num-requests", "10"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["run", "--trace", str(azure_conv), "--num-requests", "10", "--cost-model", "roofline"]) == 0
    assert "warning" not in capsys.readouterr().err
