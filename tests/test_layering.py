"""The layers import downwards only (docs/architecture.md draws them):

    paged.core       pure Python: nothing heavier than the standard library
    paged.workloads  trace readers and workloads (numpy): below the simulator, the engine, the load generator
                     (with paged.metrics_summary and paged.health, which both sides summarise with)
    sim              the simulator (simpy): never the engine or the HTTP layer
    paged.engine     torch: never the simulator or the HTTP layer
    paged.serve      HTTP, above the engine
    kernels          Triton: never the core or the simulator

Checked twice: statically over every file's imports, and by importing the core and the
simulator in a fresh interpreter and looking at what got loaded.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "triton", "fastapi", "uvicorn", "starlette", "httpx", "prometheus_client", "ray")
FORBIDDEN = {
    "paged/core": ("sim", "paged.engine", "paged.serve", "paged.workloads", "kernels", "simpy", "numpy", "pandas",
                   *HEAVY),
    "paged/workloads": ("sim", "paged.engine", "paged.serve", "kernels", "simpy", *HEAVY),
    "paged/metrics_summary.py": ("sim", "paged.engine", "paged.serve", "kernels", "simpy", *HEAVY),
    "paged/health.py": ("sim", "paged.engine", "paged.serve", "kernels", "simpy", *HEAVY),
    "paged/output_paths.py": ("sim", "paged.engine", "paged.serve", "kernels", "simpy", *HEAVY),
    "paged/help_formatter.py": ("sim", "paged.engine", "paged.serve", "kernels", "simpy", *HEAVY),
    "sim": ("paged.engine", "paged.serve", "kernels", "torch", "triton", "fastapi", "uvicorn", "starlette"),
    "paged/engine": ("sim", "paged.serve"),
    "kernels": ("paged", "sim"),
}


def imported_modules(path: Path) -> set[str]:
    """Absolute names of every module a file imports (relative imports resolved)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)
    return names


def violations(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    where = ROOT / folder
    for path in [where] if where.is_file() else sorted(where.rglob("*.py")):
        for name in sorted(imported_modules(path)):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(ROOT)} imports {name}")
    return found


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_layers_import_downwards_only(folder):
    assert violations(folder, FORBIDDEN[folder]) == []


def test_the_check_sees_a_violation(tmp_path, monkeypatch):
    """The static check must be able to fail: a core file importing the engine is caught."""
    bad = tmp_path / "paged" / "core"
    bad.mkdir(parents=True)
    (bad / "leak.py").write_text("from ..engine import LLM\nimport torch\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert violations("paged/core", FORBIDDEN["paged/core"]) == [
        "paged/core/leak.py imports paged.engine", "paged/core/leak.py imports paged.engine.LLM",
        "paged/core/leak.py imports torch"]


def test_core_and_simulator_load_no_torch_nor_http():
    code = ("import sys, paged, paged.core, paged.core.routing, paged.workloads.workload, paged.metrics_summary, "
            "paged.health, sim, sim.cli, sim.search\n"
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
