"""Start `paged serve` in a subprocess on a free loopback port, wait until it answers /health,
and always stop it (terminate, then kill) when the caller is done. For tests and benchmarks.
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


@dataclass
class Launched:
    url: str
    proc: subprocess.Popen
    log: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        deadline = time.monotonic() + start_timeout_s
        while not _healthy(server.url):
            if proc.poll() is not None or time.monotonic() > deadline:
                why = f"exited with {proc.returncode}" if proc.poll() is not None else "did not answer /health"
                raise RuntimeError(f"paged serve {why}:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
