"""`paged <command>` (also `python -m paged <command>`): the deploy half's command line.

    paged serve --model smollm2-135m --port 8000           an OpenAI-compatible server (as `vllm serve`)
    paged router --backend URL --backend URL --policy P    a load balancer over OpenAI-compatible servers
    paged launch --model smollm2-135m --replicas 2         replicas and a router in front of them
    paged doctor URL                                       the troubleshooting checks of a running server
    paged bench serve|scheduler|engine ...                 a trace against a URL; a scheduler step; the engine

Each command lives in its own module with a `main(argv) -> int`, imported only when named, so
`paged --help` does not load torch or an HTTP stack.
"""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "serve": ("paged.serve.server", "an OpenAI-compatible HTTP server over the engine"),
    "router": ("paged.serve.router", "a load balancer in front of OpenAI-compatible servers"),
    "launch": ("paged.serve.launch", "N engine servers and a router, stopped together"),
    "doctor": ("paged.serve.doctor", "the article's health checks against a running server"),
    "bench": (None, "benchmarks: serve (a trace against a URL), scheduler (one step), engine (vs transformers)"),
}
BENCHES = {
    "serve": ("paged.serve.bench_serve", "replay a trace against an OpenAI-compatible URL"),
    "scheduler": ("paged.bench", "the cost of one scheduling step at 64, 256 and 1,024 running requests"),
    "engine": ("paged.engine.bench", "the engine's output tokens/s against transformers' generate()"),
}


def _usage(table: dict, prog: str) -> str:
    lines = [f"usage: {prog} <command> [options]   ({prog} <command> --help for its options)", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in table.items()]
    return "\n".join(lines)


def _dispatch(table: dict, argv: list[str], prog: str) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(table, prog))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in table:
        print(f"{prog}: unknown command {name!r}; expected one of {list(table)}\n\n{_usage(table, prog)}",
              file=sys.stderr)
        return 2
    module = table[name][0]
    if module is None:
        return _dispatch(BENCHES, rest, f"{prog} {name}")
    code = importlib.import_module(module).main(rest)
    return int(code or 0)


def main(argv: list[str] | None = None) -> int:
    return _dispatch(COMMANDS, list(sys.argv[1:] if argv is None else argv), "paged")


if __name__ == "__main__":
    sys.exit(main())
