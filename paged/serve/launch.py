"""`paged launch`: N engine servers and a router in front of them, started and stopped together.

    paged launch --model smollm2-135m --replicas 2 --router prefix_aware --port 8000 --max-num-seqs 64

Each replica is `python -m paged serve --model M --host 127.0.0.1 --port <free port>` plus every
option this command does not know (engine options, passed through unchanged), writing its
output to `--log-dir`/replica-I.log. When all answer `/health`, `paged router` starts on
`--port` in front of them (router.log), with `--cache-threshold`, the engines' `--block-size`, `--max-num-seqs` and
`--max-body-bytes` if given, and their `--api-key` (in its environment), which it sends on its own requests to them.
A kv_aware router also gets the replicas' tokenizer (their `--tokenizer`, else `--model`, which it must
then find as `paged serve` does) and `--chat-template`, to match text and chat prompts against their caches.
SIGINT (Ctrl-C) or SIGTERM stops them all: SIGTERM, then SIGKILL after `--stop-timeout-s`.
Every child is also asked to die with the launcher (Linux's parent-death signal), so not even a
SIGKILL of the launcher leaves orphans.

A replica that exits while serving is left out by the router's health checks (the launcher
says so and goes on); a replica that fails to start, or the router exiting, stops everything.
Replicas on other machines need no launcher: give their URLs to `paged router`.
`--server-command` replaces `python -m paged serve` (e.g. a vLLM server, or a fake in tests).
Free ports are found by binding port 0: another program may take one before the replica binds
it, and the replica then fails to start, which is reported.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from paged.core.routing import DEFAULT_CACHE_THRESHOLD, ROUTERS
from paged.help_formatter import ArgumentParser, HelpFormatter

from .server_process import check_listen_address, free_port, wait_healthy

REPLICA_HOST = "127.0.0.1"  # the router, on this machine, is the replicas' only client
POLL_S = 0.2  # between two looks at the children while serving


class Stop(Exception):
    """SIGINT or SIGTERM: stop everything."""


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when the launcher dies (Linux; elsewhere a no-op)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


class Children:
    """The processes this launcher started, each with its log file."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        """`env`: variables added to this process's environment for the child."""
        with open(self.log_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=_die_with_parent, env=None if env is None else {**os.environ, **env})
        self.procs[name] = proc
        return proc

    def wait_healthy(self, name: str, url: str, deadline: float) -> None:
        """Until `name` answers /health at `url`; RuntimeError (with its log's end) if it exits
        first or `deadline` (time.monotonic()) passes."""
        wait_healthy(url, self.procs[name], deadline - time.monotonic(), name, self.log_dir / f"{name}.log")

    def log_tail(self, name: str, lines: int = 20) -> str:
        text = (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop_all(self, timeout_s: float) -> None:
        """SIGTERM to all (the router first, so that it stops taking requests), SIGKILL to what
        is left after `timeout_s`, and wait for every one: no orphans, no zombies."""
        live = [p for p in reversed(self.procs.values()) if p.poll() is None]
        for p in live:
            p.terminate()
        deadline = time.monotonic() + timeout_s
        for p in live:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def router_options(server_options: list[str]) -> list[str]:
    """The engines' --block-size, for the router's prefix ids to name the blocks the engines
    cache, --max-num-seqs, which sizes prefix_aware's imbalance limit, and --max-body-bytes, so
    that the router refuses no body the replicas take (each left out when the engines use their
    default). Their KV cache size the router reads from their metrics (`vllm:cache_config_info`)."""
    return [x for flag in ("--block-size", "--max-num-seqs", "--max-body-bytes")
            if (value := _server_option(server_options, flag)) is not None for x in (flag, value)]


def router_tokenizer_options(model: str, policy: str, server_options: list[str]) -> list[str]:
    """kv_aware matches a text or chat prompt only once cut into the replicas' tokens: its router
    gets their tokenizer (their --tokenizer, else --model) and their --chat-template if they have
    one, without which it would route text and chat by load alone. Other policies need none (and a
    router without one never imports torch)."""
    if policy != "kv_aware":
        return []
    options = ["--tokenizer", _server_option(server_options, "--tokenizer") or model]
    template = _server_option(server_options, "--chat-template")
    return options if template is None else [*options, "--chat-template", template]


def router_env(server_options: list[str]) -> dict | None:
    """The replicas' --api-key for the router, which needs it for its own requests to them (KV
    events): in its environment ($PAGED_API_KEY), not on its command line, where any user of the
    machine could read it. None when the replicas take no key from their options (one in this
    process's $PAGED_API_KEY reaches the router as it reaches the replicas)."""
    key = _server_option(server_options, "--api-key")
    return None if key is None else {"PAGED_API_KEY": key}


def _server_option(server_options: list[str], flag: str) -> str | None:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(flag)
    return getattr(p.parse_known_args(server_options)[0], flag.lstrip("-").replace("-", "_"))


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="paged launch", description=__doc__.split("\n\n")[0],
                                epilog="Any other option is passed to every replica's server.",
                                formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, help="name or path of the model every replica serves (as paged "
                                                   "serve --model takes it)")
    p.add_argument("--replicas", type=int, default=1, help="number of engine servers behind the router")
    p.add_argument("--router", default="round_robin", choices=ROUTERS, help="the routing policy")
    p.add_argument("--cache-threshold", type=float, default=DEFAULT_CACHE_THRESHOLD,
                   help="prefix_aware: the router's --cache-threshold, the match rate at or below which a request "
                        "goes to the replica the router sent the least prefixes, not to the longest match")
    p.add_argument("--host", default="127.0.0.1",
                   help="host name the router listens on; the replicas listen on 127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="the router's port")
    p.add_argument("--log-dir", default=None, help="folder of the replicas' and the router's logs (default: a new "
                                                         "temporary folder)")
    p.add_argument("--server-command", default=f"{shlex.quote(sys.executable)} -m paged serve",
                   help="the command of one replica, before --model/--host/--port")
    p.add_argument("--startup-timeout-s", type=float, default=600.0,
                   help="seconds to wait for every replica to be healthy")
    p.add_argument("--stop-timeout-s", type=float, default=10.0, help="seconds from SIGTERM to SIGKILL when stopping")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, server_options = parser.parse_known_args(argv)
    if args.replicas < 1:
        parser.error(f"--replicas {args.replicas}: expected >= 1")
    if not 0 <= args.cache_threshold <= 1:  # here, before any replica starts; NaN too
        parser.error(f"--cache-threshold {args.cache_threshold}: expected a number in [0, 1]")
    try:  # before any replica starts: the router's address, and the folder for the logs
        check_listen_address(args.host, args.port)
    except ValueError as e:
        parser.error(str(e))
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="paged-launch-"))
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"--log-dir {log_dir}: cannot create it ({e.strerror}); expected a folder path")
    children = Children(log_dir)

    def stop(signum, _frame):
        raise Stop(signal.Signals(signum).name)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _run(args, server_options, children)
    except Stop as e:
        print(f"launch: {e}: stopping", flush=True)
        return 0
    except RuntimeError as e:
        print(f"launch: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        children.stop_all(args.stop_timeout_s)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _run(args: argparse.Namespace, server_options: list[str], children: Children) -> int:
    deadline = time.monotonic() + args.startup_timeout_s
    urls = []
    for i in range(args.replicas):
        port = free_port()
        cmd = [*shlex.split(args.server_command), "--model", args.model, "--host", REPLICA_HOST, "--port", str(port),
               *server_options]
        proc = children.start(f"replica-{i}", cmd)
        urls.append(f"http://{REPLICA_HOST}:{port}")
        print(f"replica {i}: pid {proc.pid} at {urls[-1]} (log {children.log_dir / f'replica-{i}.log'})", flush=True)
    for i, url in enumerate(urls):
        children.wait_healthy(f"replica-{i}", url, deadline)
    router_cmd = [sys.executable, "-m", "paged", "router", "--policy", args.router, "--host", args.host,
                  "--port", str(args.port), "--cache-threshold", repr(args.cache_threshold),
                  *router_options(server_options), *router_tokenizer_options(args.model, args.router, server_options)]
    for url in urls:
        router_cmd += ["--backend", url]
    proc = children.start("router", router_cmd, router_env(server_options))
    router_url = f"http://{args.host}:{args.port}"
    children.wait_healthy("router", router_url, deadline)
    print(f"router: pid {proc.pid} at {router_url} ({args.router} over {args.replicas} replicas); "
          f"Ctrl-C stops all", flush=True)
    return _supervise(children)


def _supervise(children: Children) -> int:
    """Until a signal: report replicas that exit; stop everything if the router does."""
    reported = set()
    while True:
        for name, proc in children.procs.items():
            code = proc.poll()
            if code is None or name in reported:
                continue
            if name == "router":
                raise RuntimeError(f"the router exited with code {code}:\n{children.log_tail('router')}")
            reported.add(name)
            print(f"launch: {name} exited with code {code}; the router serves without it", flush=True)
        time.sleep(POLL_S)
