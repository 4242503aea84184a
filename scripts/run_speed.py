"""The speed of a whole `python -m sim run` as a user runs it: interpreter start, imports, trace
loading, simulation, summary. A benchmark, not a test: it prints figures and asserts nothing.

    python scripts/run_speed.py                      # this checkout, 5 runs: min and median wall s
    python scripts/run_speed.py /path/to/base -n 5   # interleaved with a base checkout, and the ratio
    python scripts/run_speed.py /path/to/base --callgrind   # instructions (valgrind): deterministic,
                                                            # unlike seconds on a shared machine

Under --callgrind both checkouts run with a fixed hash seed and one OpenBLAS thread (`CALLGRIND_ENV`):
with a random seed the same code counted up to 25M instructions apart (sets and dicts of strings
iterate in another order), and OpenBLAS starts a thread per core at import.

Each checkout runs from its own root with PYTHONPATH set to it, with this interpreter. Bytecode is
cached as on a user's machine: PYTHONDONTWRITEBYTECODE is dropped and each checkout runs once, uncounted,
before the measured runs (otherwise a checkout whose __pycache__ happens to exist is timed without the
compile step and the other with it).
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRACE = "traces/azure_llm_2023_conv.csv"
COMMAND = ["-m", "sim", "run", "--trace", TRACE, "--model", "llama-2-7b",
           "--hardware", "a100-80gb"]


CALLGRIND_ENV = {"PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}


def run_env(tree: Path, callgrind: bool) -> dict:
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "PYTHONPATH": str(tree)}
    return {**env, **CALLGRIND_ENV} if callgrind else env


def run_once(tree: Path, callgrind: bool) -> float:
    env = run_env(tree, callgrind)
    if not callgrind:
        start = time.perf_counter()
        subprocess.run([sys.executable, *COMMAND], cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out", sys.executable,
                               *COMMAND], cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    return float(re.search(r"Collected : (\d+)", done.stderr).group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", nargs="?", type=Path, help="a checkout to compare with (run interleaved)")
    parser.add_argument("-n", type=int, default=5, help="runs per checkout (default 5; 1 with --callgrind)")
    parser.add_argument("--callgrind", action="store_true", help="count instructions instead of seconds")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error(f"-n {args.n}: expected runs per checkout >= 1")
    if args.base and not (args.base / TRACE).is_file():  # now, not as a traceback after this checkout's first run
        parser.error(f"base {args.base}: expected a checkout of this project (it has no {TRACE})")
    here = Path(__file__).resolve().parent.parent
    trees = {"current": here} | ({"base": args.base.resolve()} if args.base else {})
    n = 1 if args.callgrind and args.n == 5 else args.n
    figures: dict[str, list[float]] = {name: [] for name in trees}
    for tree in trees.values():
        run_once(tree, callgrind=False)
    for _ in range(n):
        for name, tree in trees.items():
            figures[name].append(run_once(tree, args.callgrind))
    unit = "instructions" if args.callgrind else "s"
    for name, xs in figures.items():
        print(f"{name:8} {trees[name]}: min {min(xs):.4g} median {statistics.median(xs):.4g} {unit} "
              f"({', '.join(f'{x:.4g}' for x in xs)})")
    if args.base:
        lo, med = (f(figures["base"]) / f(figures["current"]) for f in (min, statistics.median))
        print(f"base / current: {lo:.2f}x by the min, {med:.2f}x by the median")
    return 0


if __name__ == "__main__":
    sys.exit(main())
