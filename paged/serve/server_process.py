"""Start `paged serve` in a subprocess on a free loopback port, wait until it answers /health,
and always stop it (terminate, then kill) when the caller is done. For tests and benchmarks.

`wait_healthy` is the one loop that waits for a server's /health: this module, `paged launch`
(its replicas and its router), the router benchmark and the tests' fixtures all use it.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.1


@dataclass
class Launched:
    url: str
    proc: subprocess.Popen
    log: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_listen_address(host: str, port: int) -> None:
    """A ValueError naming `--host`/`--port` unless this process could listen there now: checked
    before a model loads, so that a port in use, out of range or a host not of this machine fails
    in a second, not after the load as uvicorn's own bind does."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port {port}: expected a TCP port in [0, 65535]")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            s.bind(address)
    except OSError as e:
        raise ValueError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e}); expected a free "
                         "port on an address of this machine") from None


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float, name: str = "the server",
                 log: Path | None = None) -> None:
    """Poll `url`/health until it answers 200. A RuntimeError naming `name` (with the end of its
    `log`) if `proc` exits first, or if `timeout_s` passes without a 200: a server that dies while
    starting is reported at once, not after the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with code {proc.returncode} while starting{_tail(log)}")
        if _healthy(url):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} at {url} did not answer /health with 200 within {timeout_s:g} s{_tail(log)}")
        time.sleep(POLL_S)


def _tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    return f"; the end of its log ({log}):\n{log.read_text(errors='replace')[-3000:]}"


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@contextmanager
def launched_server(model: str | Path, flags: list[str], log: Path, env: dict | None = None,
                    start_timeout_s: float = 120.0) -> Iterator[Launched]:
    """The server, its output in `log`; RuntimeError with the log's tail if it exits or stays
    silent for `start_timeout_s` (loading a model on a loaded machine takes a while)."""
    port = free_port()
    cmd = [sys.executable, "-m", "paged", "serve", "--model", str(model), "--port", str(port), *flags]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get(
        "PYTHONPATH")])), **(env or {})}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=environment, stdout=out, stderr=subprocess.STDOUT)
    server = Launched(f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_healthy(server.url, proc, start_timeout_s, "paged serve", log)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
