"""The deploy half's command lines at their edges (`paged serve`, `paged launch`, `paged bench
serve`, `python -m paged.engine`): a bad model, option, address or output path is one line naming
it and exit status 2, found before a model loads, a replica starts or a replay begins; never a
traceback."""
from __future__ import annotations

import socket

import pytest

import paged.engine
import paged.engine.__main__ as engine_cli
from paged.serve import bench_serve, doctor, launch, router, server

from .conftest import REPO

AZURE_CONV = REPO / "traces" / "azure_llm_2023_conv.csv"
NOBODY = "http://127.0.0.1:9"  # the discard port: nothing listens there


def exit_status(fn, argv) -> int:
    try:
        return fn(argv)
    except SystemExit as e:
        return e.code


@pytest.fixture
def no_engine(monkeypatch):
    """Loading a model fails the test: the error must come first."""
    def fail(*_args, **_kwargs):
        raise AssertionError("the engine was built")

    monkeypatch.setattr(paged.engine, "AsyncLLM", fail)
    monkeypatch.setattr(engine_cli, "LLMEngine", fail)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_bench_serve_checks_outputs_before_contacting_the_server(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    for option, path, message in (("--json", tmp_path, "is a folder; expected a file path"),
                                  ("--requests-csv", tmp_path / "f" / "r.csv", "is a file, so it cannot hold r.csv")):
        argv = ["--url", NOBODY, "--trace", str(AZURE_CONV), "--num-requests", "3", option, str(path)]
        assert bench_serve.main(argv) == 2
        line = one_line(capsys.readouterr().err)
        assert f"{option} {path}: " in line and message in line


def test_bench_serve_tries_its_outputs_before_contacting_the_server(unwritable, capsys):
    """Tried, not asked of os.access, which lets root write anywhere: the replay then lost its results."""
    for option, path in (("--json", unwritable / "b.json"), ("--requests-csv", unwritable / "new" / "r.csv")):
        assert bench_serve.main(["--url", NOBODY, "--trace", str(AZURE_CONV), option, str(path)]) == 2
        assert f"error: {option} {path}: cannot write it (" in one_line(capsys.readouterr().err)


def test_bench_serve_refuses_a_model_the_server_does_not_serve(backends, monkeypatch, capsys):
    """Not a replay whose every request fails with 404, ending in exit status 0."""
    monkeypatch.setattr(bench_serve, "replay_in_processes", lambda *a: pytest.fail("the replay started"))
    (url, _), = backends(["b0"])
    argv = ["--url", url, "--trace", str(AZURE_CONV), "--num-requests", "3", "--no-progress", "--model", "smol"]
    assert bench_serve.main(argv) == 2
    assert f"error: --model smol: {url} does not serve it; expected one of ['fake-model']" in one_line(
        capsys.readouterr().err)


def test_bench_serve_names_the_option_of_a_write_that_fails_after_the_replay(backends, unwritable, monkeypatch,
                                                                             capsys):
    """Checked first, but a disk may fill during a replay: one line naming the option, not a traceback."""
    monkeypatch.setattr(bench_serve, "check_output_paths", lambda outputs: None)
    (url, _), = backends(["b0"])
    path = unwritable / "b.json"
    argv = ["--url", url, "--trace", str(AZURE_CONV), "--num-requests", "2", "--time-scale", "0.01",
            "--max-model-len", "300", "--no-progress", "--json", str(path)]
    assert bench_serve.main(argv) == 2
    assert f"error: --json {path}: cannot write it (" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("url", [NOBODY, "notaurl"])
def test_bench_serve_names_a_url_it_cannot_reach(url, capsys):
    assert bench_serve.main(["--url", url, "--trace", str(AZURE_CONV), "--num-requests", "3"]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"--url {url}: cannot list its models at /v1/models" in line and "expected a running OpenAI" in line


def test_bench_serve_refuses_goodput_targets_at_or_below_zero(capsys):
    argv = ["--url", NOBODY, "--trace", str(AZURE_CONV), "--slo-ttft-s", "-1"]
    assert exit_status(bench_serve.main, argv) == 2
    assert "argument --slo-ttft-s: '-1': expected a finite number > 0" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--model", "no-such-model"], "model 'no-such-model': no such file or folder, and not a known name"),
    (["--model", "smollm2-135m", "--block-size", "12"], "EngineConfig.block_size=12: expected a power of two"),
    (["--model", "smollm2-135m", "--kv-cache-dtype", "fp4"], "EngineConfig.kv_cache_dtype='fp4': expected one of"),
])
def test_serve_names_a_bad_model_or_engine_option(monkeypatch, capsys, argv, message):
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("uvicorn started"))
    assert server.main([*argv, "--port", "0"]) == 2
    assert message in one_line(capsys.readouterr().err)


def test_serve_names_a_bad_tokenizer_before_loading_the_model(no_engine, capsys):
    """As the router does: the option named, not --model, and no engine built."""
    assert server.main(["--model", "smollm2-135m", "--tokenizer", "/nonexistent", "--port", "0"]) == 2
    assert ("--tokenizer /nonexistent: model '/nonexistent': no such file or folder"
            in one_line(capsys.readouterr().err))


def test_serve_takes_a_tokenizer_named_as_a_model_is(monkeypatch, capsys):
    """--tokenizer smollm2-135m (a catalog name, a GGUF file) was opened as a folder: a traceback."""
    import uvicorn

    served = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **k: served.append(app))
    assert server.main(["--model", "smollm2-135m", "--tokenizer", "smollm2-135m", "--port", "0"]) == 0
    assert len(served) == 1 and "Traceback" not in capsys.readouterr().err


def test_serve_checks_its_address_before_loading_the_model(no_engine, capsys):
    assert server.main(["--model", "smollm2-135m", "--port", "80000"]) == 2
    assert "--port 80000: expected a TCP port in [0, 65535]" in one_line(capsys.readouterr().err)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert server.main(["--model", "smollm2-135m", "--port", str(port)]) == 2
    assert f"--host 127.0.0.1 --port {port}: cannot listen there" in one_line(capsys.readouterr().err)


def test_launch_refuses_before_starting_a_replica(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(launch, "_run", lambda *a: pytest.fail("a replica was started"))
    (tmp_path / "f").write_text("")
    assert exit_status(launch.main, ["--model", "smollm2-135m", "--replicas", "0"]) == 2
    assert "--replicas 0: expected >= 1" in capsys.readouterr().err
    assert exit_status(launch.main, ["--model", "smollm2-135m", "--log-dir", str(tmp_path / "f" / "logs")]) == 2
    assert f"--log-dir {tmp_path / 'f' / 'logs'}: cannot create it" in capsys.readouterr().err
    assert exit_status(launch.main, ["--model", "smollm2-135m", "--port", "-1"]) == 2
    assert "--port -1: expected a TCP port" in capsys.readouterr().err


def test_engine_command_line_names_bad_input(tmp_path, no_engine, capsys):
    assert engine_cli.main(["generate", "--model", "smollm2-135m", "--prompt", "x", "--max-tokens", "0"]) == 2
    assert "SamplingParams.max_tokens=0: expected an integer >= 1" in one_line(capsys.readouterr().err)
    assert engine_cli.main(["profile", "--model", "smollm2-135m", "--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path}: is a folder" in one_line(capsys.readouterr().err)


def test_engine_command_line_names_an_unknown_model(capsys):
    assert engine_cli.main(["generate", "--model", "no-such-model", "--prompt", "x"]) == 2
    assert "model 'no-such-model': no such file or folder" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("argv, message", [
    (["--backend", "notaurl"], "--backend notaurl: expected a server's URL, such as http://127.0.0.1:8000"),
    (["--backend", "127.0.0.1:8000"], "--backend 127.0.0.1:8000: expected a server's URL"),
    (["--backend", NOBODY, "--port", "99999"], "--port 99999: expected a TCP port in [0, 65535]"),
    (["--backend", NOBODY, "--policy", "kv_aware", "--tokenizer", "no-such-model"],
     "--tokenizer no-such-model: model 'no-such-model': no such file or folder, and not a known name"),
])
def test_router_refuses_what_would_leave_it_serving_nothing(monkeypatch, capsys, argv, message):
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("uvicorn started"))
    assert exit_status(router.main, argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("option, value, expected", [
    *((option, value, "expected at least 1") for option in ("--block-size", "--max-num-seqs", "--num-gpu-blocks",
                                                             "--abort-after-failed-probes", "--max-body-bytes")
      for value in ("0", "-3")),
    *((option, value, "expected a finite number of seconds > 0")
      for option in ("--health-interval-s", "--health-timeout-s", "--connect-timeout-s", "--read-timeout-s",
                     "--kv-events-interval-s") for value in ("0", "-1", "nan", "inf")),
])
def test_router_names_a_number_option_out_of_range(monkeypatch, capsys, option, value, expected):
    """Zero, negative, NaN and infinite numbers were taken: a 0 s interval probed in a busy loop,
    --block-size 0 raised ZeroDivisionError at the first prefix_aware request (a negative one hashed
    no prefix at all), --max-num-seqs 0 was a traceback; the option, its value and the range now."""
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("uvicorn started"))
    assert exit_status(router.main, ["--backend", NOBODY, option, value]) == 2
    err = capsys.readouterr().err
    assert f"paged router: error: {option} {float(value) if option.endswith('-s') else value}: {expected}" in err


@pytest.mark.parametrize("value", ["-0.1", "1.5", "nan"])
def test_router_and_launch_name_a_cache_threshold_outside_0_1(monkeypatch, capsys, value):
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("uvicorn started"))
    monkeypatch.setattr(launch, "_run", lambda *a: pytest.fail("a replica was started"))
    assert exit_status(router.main, ["--backend", NOBODY, "--cache-threshold", value]) == 2
    err = capsys.readouterr().err
    assert f"paged router: error: --cache-threshold {float(value)}: expected a number in [0, 1]" in err
    assert exit_status(launch.main, ["--model", "smollm2-135m", "--cache-threshold", value]) == 2
    assert f"--cache-threshold {float(value)}: expected a number in [0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--interval", "-1"], "--interval -1.0: expected seconds >= 0"),
    (["--gpus", "0"], "--gpus 0: expected at least 1"),
])
def test_doctor_names_a_bad_interval_or_gpu_count(capsys, argv, message):
    assert exit_status(doctor.main, [NOBODY, *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--workers", "0"], "--workers 0: expected >= 1"),
    (["--timeout-s", "0"], "argument --timeout-s: '0': expected a finite number > 0"),
    (["--block-size", "0"], "--block-size 0: expected a power of two >= 1"),
    (["--max-model-len", "0"], "--max-model-len 0: expected at least 2"),
])
def test_bench_serve_bad_settings_are_usage_errors(capsys, argv, message):
    assert exit_status(bench_serve.main, ["--url", NOBODY, "--trace", str(AZURE_CONV), *argv]) == 2
    assert message in capsys.readouterr().err


def test_bench_serve_with_a_model_named_still_checks_the_url_first(monkeypatch, capsys):
    """Else a typo in --url replays the whole trace, every request an error, and exits 0."""
    monkeypatch.setattr(bench_serve, "replay_in_processes", lambda *a: pytest.fail("the replay started"))
    assert bench_serve.main(["--url", NOBODY, "--model", "m", "--trace", str(AZURE_CONV), "--num-requests", "2"]) == 2
    assert f"--url {NOBODY}: cannot list its models" in one_line(capsys.readouterr().err)


def test_a_mistyped_chat_template_path_is_an_error_not_a_template(tmp_path, no_engine, monkeypatch, capsys):
    """'--chat-template my.jinja' with no such file was taken as the template itself: every chat
    prompt would have been the text 'my.jinja'."""
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("uvicorn started"))
    missing = str(tmp_path / "my.jinja")
    message = f"--chat-template {missing!r}: no such file, and not a Jinja template"
    assert server.main(["--model", "smollm2-135m", "--port", "0", "--chat-template", missing]) == 2
    assert message in one_line(capsys.readouterr().err)
    assert exit_status(router.main, ["--backend", NOBODY, "--port", "0", "--chat-template", missing]) == 2
    assert message in capsys.readouterr().err


def test_a_chat_template_is_read_from_a_file_or_taken_as_given(tmp_path):
    from paged.serve.router_tokens import read_chat_template

    f = tmp_path / "t.jinja"
    f.write_text("{{ messages[0]['content'] }}")
    assert read_chat_template(str(f)) == "{{ messages[0]['content'] }}"
    assert read_chat_template("{% for m in messages %}{{ m }}{% endfor %}").startswith("{% for")
    assert read_chat_template(None) is None
    # a template written out is usually longer than a file name may be (the router reads it twice: its
    # option, then the text again): taken as given, not an OSError
    long = "{% for m in messages %}<|im_start|>" + "x" * 400 + "{{ m['content'] }}<|im_end|>{% endfor %}"
    assert read_chat_template(long) == long and read_chat_template(read_chat_template(long)) == long
