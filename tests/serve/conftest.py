"""Servers as real processes on free loopback ports, each stopped by the test that started it.

`procs` starts Python processes (logs in the test's tmp_path, shown when one fails to come up)
and stops every one of them when the test ends, pass or fail: SIGTERM, then SIGKILL.
`backends(names, ...)` starts fake OpenAI-compatible servers (`tests.serve.fake_backend`),
`router(urls, policy, ...)` the router in front of some.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
STARTUP_POLLS = 600  # x 0.05 s: a server that is not up by then has failed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(text: str, name: str, **labels) -> float | None:
    """One sample's value from a Prometheus exposition (None when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def wait_until(condition, what: str, polls: int = STARTUP_POLLS) -> None:
    """Poll `condition` (bounded): a state the test needs before it goes on, not a timing claim."""
    for _ in range(polls):
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"never reached: {what}")


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

    def wait_healthy(self, url: str, proc: subprocess.Popen) -> None:
        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args} exited with {proc.returncode}:\n{proc.log_path.read_text()}")
            try:
                return httpx.get(f"{url}/health", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, f"{url}/health answers 200")

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
    """Fake servers, started together, all healthy: [(url, process)]."""
    ports = ports or [free_port() for _ in names]
    started = [(f"http://127.0.0.1:{port}",
                procs.start(name, "-m", "tests.serve.fake_backend", "--port", str(port), "--name", name, *options))
               for name, port in zip(names, ports)]
    for url, proc in started:
        procs.wait_healthy(url, proc)
    return started


@pytest.fixture
def backends(procs):
    """backends(names, *options, ports=None) -> [(url, process)]: see start_backends."""
    return lambda *args, **kwargs: start_backends(procs, *args, **kwargs)


@pytest.fixture(scope="module")
def shared_backends(tmp_path_factory):
    """Three fake servers (b0, b1, b2; 50 ms a token) for the tests of a module that kill none
    of them: URLs."""
    p = Processes(tmp_path_factory.mktemp("shared"))
    try:
        yield [url for url, _ in start_backends(p, ["b0", "b1", "b2"], "--token-delay-s", "0.05")]
    finally:
        p.stop_all()


@pytest.fixture
def router(procs):
    """router(urls, policy, *options) -> url: `paged router` in front of them, healthy."""

    def start(urls: list[str], policy: str, *options: str, healthy: bool = True) -> str:
        port = free_port()
        args = ["-m", "paged", "router", "--port", str(port), "--policy", policy, *options]
        for u in urls:
            args += ["--backend", u]
        proc = procs.start(f"router-{port}", *args)
        url = f"http://127.0.0.1:{port}"
        if healthy:
            procs.wait_healthy(url, proc)
        else:  # no backend in service: up when it answers at all
            wait_until(lambda: _answers(url), f"{url} answers")
        return url

    return start


def _answers(url: str) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=1.0)
        return True
    except httpx.HTTPError:
        return False
