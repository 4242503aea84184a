"""Real servers in subprocesses on free loopback ports, each stopped by the test that started it.

`server` / `running_server` start `paged serve` over a tiny random model (`launched_server`:
terminate, then kill, in a finally; it waits for /health for a bounded time and fails with the
server's own log if it dies first). `procs` starts Python processes (logs in the test's
tmp_path) and stops every one of them when the test ends, pass or fail: SIGTERM, then SIGKILL.
`backends(names, ...)` starts fake OpenAI-compatible servers (`tests.serve.fake_backend`),
`start_router(...)` a router in front of some, `cluster(...)` both at once, and `shared` a
module's set of fake servers with a router of each policy.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tiny_models imports transformers: never the network

from paged.serve.server_process import free_port, launched_server, wait_healthy  # noqa: E402
from tests.engine.tiny_models import make_tiny_model  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0  # for a fake server or a router to answer /health on a loaded machine

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
    log: Path

    def get(self, path: str, **kwargs) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30, **kwargs)

    def post(self, path: str, **kwargs) -> httpx.Response:
        return httpx.post(self.url + path, timeout=60, **kwargs)


@contextmanager
def running_server(model: Path, *flags: str, log_dir: Path, env: dict | None = None):
    log = log_dir / f"server-{len(list(log_dir.iterdir()))}.log"
    with launched_server(model, [*flags, "--log-level", "warning"], log, env) as launched:
        yield Server(launched.url, launched.log)


@pytest.fixture(scope="package")
def server(tiny_chat_model, tmp_path_factory):
    with running_server(tiny_chat_model, *engine_flags(), "--max-body-bytes", "65536",
                        log_dir=tmp_path_factory.mktemp("logs")) as s:
        yield s


@pytest.fixture(scope="package")
def model_name(tiny_chat_model) -> str:
    return str(tiny_chat_model)


def metric(text: str, name: str, **labels) -> float | None:
    """One sample's value from a Prometheus exposition (None when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def wait_until(predicate, what: str, tries: int = 600, pause: float = 0.05):
    """Poll `predicate` a bounded number of times (a state the test needs before it goes on, not a
    timing claim); fail naming `what` if it never holds. Returns the predicate's value."""
    for _ in range(tries):
        value = predicate()
        if value:
            return value
        time.sleep(pause)
    pytest.fail(f"never happened: {what}")


class Processes:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[subprocess.Popen] = []

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        proc.log_path = self.logs / f"{name}.log"
        self.started.append(proc)
        return proc

    @staticmethod
    def wait_healthy(url: str, proc: subprocess.Popen) -> None:
        wait_healthy(url, proc, START_TIMEOUT_S, " ".join(map(str, proc.args)), proc.log_path)

    @staticmethod
    def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            self.stop(proc)


@pytest.fixture
def procs(tmp_path):
    p = Processes(tmp_path)
    try:
        yield p
    finally:
        p.stop_all()


def start_backends(procs: Processes, names: list[str], *options: str, ports: list[int] | None = None):
    """Fake servers, started together (not yet waited for): [(url, process)]."""
    ports = ports or [free_port() for _ in names]
    return [(f"http://127.0.0.1:{port}",
             procs.start(name, "-m", "tests.serve.fake_backend", "--port", str(port), "--name", name, *options))
            for name, port in zip(names, ports)]


def start_router(procs: Processes, urls: list[str], policy: str, *options: str):
    """`paged router` in front of `urls` (not yet waited for): (url, process)."""
    port = free_port()
    args = ["-m", "paged", "router", "--port", str(port), "--policy", policy, *options]
    for u in urls:
        args += ["--backend", u]
    return f"http://127.0.0.1:{port}", procs.start(f"router-{policy}-{port}", *args)


def wait_router(procs: Processes, url: str, proc, backends: list[str]) -> None:
    """Until the router answers and has every one of `backends` in service."""
    procs.wait_healthy(url, proc)
    wait_until(lambda: all(metric(httpx.get(f"{url}/metrics", timeout=5).text, "paged_router_backend_healthy",
                                  backend=b) == 1 for b in backends), f"{url} has {backends} in service")


@pytest.fixture
def backends(procs):
    """backends(names, *options, ports=None) -> [(url, process)]: fake servers, all healthy."""

    def start(*args, **kwargs):
        started = start_backends(procs, *args, **kwargs)
        for url, proc in started:
            procs.wait_healthy(url, proc)
        return started

    return start


@pytest.fixture
def cluster(procs):
    """cluster(names, policy, backend_options=(), router_options=()) -> ([(url, process)], router
    URL): fake servers and a router in front of them, started at once, all in service."""

    def start(names: list[str], policy: str, backend_options=(), router_options=()):
        started = start_backends(procs, names, *backend_options)
        urls = [u for u, _ in started]
        url, proc = start_router(procs, urls, policy, "--health-interval-s", "0.2", *router_options)
        for u, p in started:
            procs.wait_healthy(u, p)
        wait_router(procs, url, proc, urls)
        return started, url

    return start


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """For the tests of a module that kill nothing: three fake servers (b0, b1, b2; 50 ms a
    token), a router of each policy in front of them (least_kv scraping often), and one in front
    of nothing, all started at once. A dict: "backends" (URLs), each policy's router URL, and
    "nowhere" (the router without a backend), and "logs" (the folder of their logs)."""
    p = Processes(tmp_path_factory.mktemp("shared"))
    try:
        started = start_backends(p, ["b0", "b1", "b2"], "--token-delay-s", "0.05")
        urls = [u for u, _ in started]
        routers = {policy: start_router(p, urls, policy, *(("--health-interval-s", "0.2") if policy == "least_kv"
                                                              else ()))
                   for policy in ("round_robin", "prefix_aware", "least_kv")}
        nowhere, nowhere_proc = start_router(p, [f"http://127.0.0.1:{free_port()}"], "least_outstanding")
        for u, proc in started:
            p.wait_healthy(u, proc)
        for url, proc in routers.values():
            wait_router(p, url, proc, urls)
        wait_until(lambda: _answers(nowhere, nowhere_proc), "the router without a backend answers")
        yield {"backends": urls, "nowhere": nowhere, "logs": p.logs,
               **{policy: url for policy, (url, _) in routers.items()}}
    finally:
        p.stop_all()


def _answers(url: str, proc) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"{proc.args} exited with {proc.returncode}:\n{proc.log_path.read_text()}")
    try:
        httpx.get(f"{url}/health", timeout=1.0)
        return True
    except httpx.HTTPError:
        return False
