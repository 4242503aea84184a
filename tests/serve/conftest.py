"""Real servers in subprocesses on free loopback ports, over tiny random models.

Every server is started and stopped by the fixture that owns it (terminate, then kill, in a
finally), waits for /health in a bounded loop, and fails with its own log if it dies first.
"""
import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tiny_models imports transformers: never the network

from tests.engine.tiny_models import make_tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# One byte-level token per character; the template closes each turn with EOS, as chat models do.
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
# Engine settings shared by the servers and the in-process reference engine.
ENGINE = {"max_model_len": 512, "kv_cache_memory_bytes": 4 << 20, "max_num_batched_tokens": 256, "max_num_seqs": 16,
          "threads": 1}


def engine_flags(**overrides) -> list[str]:
    flags = []
    for name, value in {**ENGINE, **overrides}.items():
        flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory) -> Path:
    """A tiny random Llama folder with a tokenizer_config.json carrying a chat template."""
    folder = tmp_path_factory.mktemp("serve") / "tiny"
    make_tiny_model(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATE}))
    return folder


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log: Path

    def get(self, path: str, **kwargs) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30, **kwargs)

    def post(self, path: str, **kwargs) -> httpx.Response:
        return httpx.post(self.url + path, timeout=60, **kwargs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(model: Path, *flags: str, log_dir: Path, env: dict | None = None):
    port = free_port()
    log = log_dir / f"server-{port}.log"
    cmd = [sys.executable, "-m", "paged", "serve", "--model", str(model), "--port", str(port),
           "--log-level", "warning", *flags]
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=environment, stdout=out, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", proc, log)
    try:
        for _ in range(600):  # up to about a minute on a loaded machine
            if proc.poll() is not None:
                pytest.fail(f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(server.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        else:
            pytest.fail(f"the server did not answer /health:\n{log.read_text()[-3000:]}")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="package")
def server(tiny_chat_model, tmp_path_factory):
    with running_server(tiny_chat_model, *engine_flags(), "--max-body-bytes", "65536",
                        log_dir=tmp_path_factory.mktemp("logs")) as s:
        yield s


@pytest.fixture(scope="package")
def model_name(tiny_chat_model) -> str:
    return str(tiny_chat_model)


def wait_until(predicate, what: str, tries: int = 300, pause: float = 0.05):
    """Poll `predicate` a bounded number of times; fail naming `what` if it never holds."""
    for _ in range(tries):
        value = predicate()
        if value:
            return value
        time.sleep(pause)
    pytest.fail(f"never happened: {what}")


