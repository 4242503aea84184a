"""`paged launch` for real, with fake backends as replicas (`--server-command`): replicas and a
router come up on free ports with a log each; a replica killed mid-run costs no request; a
signal stops every process it started, and a replica that cannot start stops the launch."""
from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import httpx

from .conftest import free_port, wait_until

FAKE_SERVER = f"{sys.executable} -m tests.serve.fake_backend"


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting for a parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def launch(procs, tmp_path: Path, replicas: int, *options: str, server: str = FAKE_SERVER,
           model: str = "fake-model"):
    """Start `paged launch` (`server=""`: its own `paged serve` replicas); returns (process, router URL)."""
    port = free_port()
    command = ["--server-command", server] if server else []
    proc = procs.start("launch", "-m", "paged", "launch", "--model", model, "--replicas", str(replicas),
                       "--port", str(port), "--log-dir", str(tmp_path / "logs"), *command,
                       "--stop-timeout-s", "5", *options)
    return proc, f"http://127.0.0.1:{port}"


def ready(procs, proc, url: str) -> dict[str, int]:
    """Wait for the launch to serve and say so; then the pids it started."""
    procs.wait_healthy(url, proc)
    wait_until(lambda: "router" in pids(proc), "the launcher prints the router's pid")
    return pids(proc)


def pids(proc) -> dict[str, int]:
    """{"replica 0": pid, ..., "router": pid} from what the launcher printed."""
    return {name: int(pid) for name, pid in re.findall(r"^(replica \d+|router): pid (\d+)", proc.log_path.read_text(),
                                                         re.M)}


def served_by(url: str) -> str:
    r = httpx.post(f"{url}/v1/completions", json={"model": "fake-model", "prompt": "hi", "max_tokens": 2}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["system_fingerprint"]


def test_three_replicas_survive_one_killed_and_stop_together(procs, tmp_path):
    proc, url = launch(procs, tmp_path, 3, "--router", "round_robin", "--token-delay-s", "0.01")
    started = ready(procs, proc, url)
    assert set(started) == {"replica 0", "replica 1", "replica 2", "router"}
    assert all((tmp_path / "logs" / f"replica-{i}.log").exists() for i in range(3))
    names = [served_by(url) for _ in range(3)]
    assert len(set(names)) == 3

    os.kill(started["replica 1"], signal.SIGKILL)
    assert all(served_by(url) != names[1] for _ in range(12))
    wait_until(lambda: "replica-1 exited" in proc.log_path.read_text(), "the launcher reports replica 1 gone")
    assert proc.poll() is None

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    assert not [name for name, pid in started.items() if alive(pid)]


def test_a_killed_launcher_leaves_no_orphans(procs, tmp_path):
    """A SIGKILL of the launcher, which can run no cleanup, still stops every child: each asked
    the kernel for a signal when its parent dies."""
    proc, url = launch(procs, tmp_path, 1)
    started = ready(procs, proc, url)
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)
    try:
        wait_until(lambda: not any(alive(pid) for pid in started.values()), "every child of the launcher gone")
    finally:  # orphans of a failed run must not outlive the test
        for pid in started.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_replica_that_cannot_start_stops_the_launch(procs, tmp_path):
    fail = f"{sys.executable} -c \"import sys; print('no GPU here'); sys.exit(3)\""
    proc, _ = launch(procs, tmp_path, 2, server=fail)
    assert proc.wait(60) == 1
    out = proc.log_path.read_text()
    assert "exited with code 3" in out and "no GPU here" in out
    assert not any(alive(pid) for pid in pids(proc).values())


def test_the_router_gets_the_replicas_api_key_in_its_environment(procs, tmp_path):
    """The router reads the replicas' KV events, which need their key: the launcher hands it over
    in the router's environment, never on its command line (which every user can read)."""
    proc, url = launch(procs, tmp_path, 1, "--api-key", "k3y")
    router = ready(procs, proc, url)["router"]
    assert b"PAGED_API_KEY=k3y" in Path(f"/proc/{router}/environ").read_bytes().split(b"\0")
    assert b"k3y" not in Path(f"/proc/{router}/cmdline").read_bytes()


def test_the_router_gets_the_launchers_cache_threshold(procs, tmp_path):
    """--cache-threshold is the router's (prefix_aware's), not the replicas': the launcher hands it to the router."""
    proc, url = launch(procs, tmp_path, 1, "--router", "prefix_aware", "--cache-threshold", "0.5")
    started = ready(procs, proc, url)
    assert b"--cache-threshold\x000.5\x00" in Path(f"/proc/{started['router']}/cmdline").read_bytes()
    assert b"--cache-threshold" not in Path(f"/proc/{started['replica 0']}/cmdline").read_bytes()


def test_a_kv_aware_router_gets_the_replicas_tokenizer_and_chat_template():
    """Without them kv_aware routed text and chat by load alone; the replicas' --tokenizer wins over
    --model, as it names what they tokenize with. Other policies get none (no torch in the router)."""
    from paged.serve.launch import router_tokenizer_options

    assert router_tokenizer_options("m", "kv_aware", ["--max-num-seqs", "4"]) == ["--tokenizer", "m"]
    assert router_tokenizer_options("m", "kv_aware", ["--tokenizer", "t", "--chat-template", "c.jinja"]) == [
        "--tokenizer", "t", "--chat-template", "c.jinja"]
    assert router_tokenizer_options("m", "prefix_aware", ["--tokenizer", "t"]) == []
