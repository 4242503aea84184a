"""What the serving tools cost: the router's added latency per request, and how closely the load
generator keeps a schedule.

    python -m paged.serve.bench_router                        # against the repository's fake backend
    python -m paged.serve.bench_router --backend http://127.0.0.1:8000 --model smollm2-135m

1. Added latency: the same one-token completion (not streamed), sent `--requests` times straight
   to the backend and as often through a `paged router` in front of it, alternately (so that a
   change of machine speed hits both alike), one at a time over kept-alive connections; the
   figure is the difference of the two p50s (and of the p10s and p90s), with the router's CPU
   time per request (from /proc), which a busy machine does not inflate as much as wall time: a
   request through the router wakes two more processes, and on a machine whose cores are all
   busy each wake-up waits for a core.
2. Send lateness: `paged bench serve`'s replay of `--rate` requests/s (constant gaps) for
   `--duration-s` against the backend, each `--output-tokens` tokens streamed back; the figure
   is p99 (and max) of how late each request left against its schedule.

Without `--backend` it starts `tests.serve.fake_backend` (from a checkout of this repository),
which answers at once: what is measured is then the HTTP path itself. Run it on a quiet machine:
on a loaded one both figures measure the machine's scheduler.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from paged.help_formatter import ArgumentParser, HelpFormatter
from paged.workloads.workload import shared_prefix_workload

from .bench_serve import summarize
from .launch import Children, free_port
from .prompts import PromptMaker
from .replay_workers import replay_in_processes


def cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) a process has used, from /proc (None where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def added_latency(direct: str, routed: str, model: str, n: int, router_pid: int) -> dict:
    body = {"model": model, "prompt": "Hello", "max_tokens": 1}
    times = {direct: [], routed: []}
    with httpx.Client(timeout=30) as client:
        for url in (direct, routed):  # warm up: connections, the router's first choices
            for _ in range(20):
                client.post(f"{url}/v1/completions", json=body).raise_for_status()
        cpu_before = cpu_s(router_pid)
        for _ in range(n):
            for url in (direct, routed):
                t = time.perf_counter()
                client.post(f"{url}/v1/completions", json=body).raise_for_status()
                times[url].append(time.perf_counter() - t)
        cpu_after = cpu_s(router_pid)
    d, r = np.array(times[direct]), np.array(times[routed])
    return {"requests": n, "direct_p50_ms": 1e3 * np.median(d), "router_p50_ms": 1e3 * np.median(r),
            "added_p50_ms": 1e3 * (np.median(r) - np.median(d)),
            "added_p10_ms": 1e3 * (np.percentile(r, 10) - np.percentile(d, 10)),  # the least disturbed
            "added_p90_ms": 1e3 * (np.percentile(r, 90) - np.percentile(d, 90)),
            # what the router computes per request, whatever else the machine runs
            "router_cpu_ms_per_request": None if cpu_before is None else 1e3 * (cpu_after - cpu_before) / n}


def send_lateness(url: str, model: str, rate: float, duration_s: float, output_tokens: int, workers: int) -> dict:
    n = int(rate * duration_s)
    workload = shared_prefix_workload(n, 4, 256, 64, output_tokens, rate, process="constant")
    records, wall_s = replay_in_processes(url, model, workload, PromptMaker(workload, 32000, 1000), workers)
    s = summarize(workload, records, wall_s)
    return {"rate": rate, "requests": n, "output_tokens": output_tokens, "workers": workers,
            "num_errors": s["num_errors"],
            **{f"lateness_{k}_ms": 1e3 * v for k, v in s["send_lateness_s"].items()}}


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m paged.serve.bench_router", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--backend", default=None, help="an OpenAI-compatible server (default: start the fake one)")
    p.add_argument("--model", default="fake-model", help="the model name sent in the requests")
    p.add_argument("--requests", type=int, default=500,
                   help="requests sent straight and as many through the router, for the added latency")
    p.add_argument("--rate", type=float, default=50.0, help="requests/s, for the send lateness")
    p.add_argument("--duration-s", type=float, default=20.0, help="seconds of the replay, for the send lateness")
    p.add_argument("--output-tokens", type=int, default=32, help="tokens streamed back per request of the replay")
    p.add_argument("--workers", type=int, default=1, help="processes of the replay")
    p.add_argument("--json", default=None, help="also write the results here (JSON)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    children = Children(Path(tempfile.mkdtemp(prefix="paged-bench-router-")))
    deadline = time.monotonic() + 120
    try:
        backend = args.backend
        if backend is None:
            port = free_port()
            children.start("backend", [sys.executable, "-m", "tests.serve.fake_backend", "--port", str(port)])
            backend = f"http://127.0.0.1:{port}"
            children.wait_healthy("backend", backend, deadline)
        port = free_port()
        proc = children.start("router", [sys.executable, "-m", "paged", "router", "--port", str(port),
                                         "--backend", backend])
        router = f"http://127.0.0.1:{port}"
        children.wait_healthy("router", router, deadline)
        result = {"router": added_latency(backend, router, args.model, args.requests, proc.pid),
                  "bench_serve": send_lateness(backend, args.model, args.rate, args.duration_s, args.output_tokens,
                                                   args.workers)}
    finally:
        children.stop_all(10.0)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
