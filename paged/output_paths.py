"""Checking a command's output paths before it works: a long run (a simulation, a search, a
real-time replay) must not end in a traceback that loses its results to a bad path. Shared by
`python -m sim` and `paged bench serve`, which write the same kinds of files."""
from __future__ import annotations

import os
from pathlib import Path


def check_output_paths(outputs: list[tuple[str, str | None, str]]) -> None:
    """Each (option, path, example suffix) asked for (a None or empty path is not) can be written.
    Each must name a file, not a folder; its folder may be missing (the command creates it), but
    then the nearest existing ancestor must be a writable folder, not a file. Two outputs may not
    share a path (one would overwrite the other). Raises ValueError naming the option and path."""
    seen: dict[Path, str] = {}
    for option, value, suffix in outputs:
        if not value:
            continue
        path = Path(value)
        if path.is_dir():
            raise ValueError(f"{option} {value}: is a folder; expected a file path, such as {path / ('out' + suffix)}")
        resolved = path.resolve()
        if resolved in seen:
            raise ValueError(f"{option} {value}: {seen[resolved]} writes the same file; expected distinct paths")
        seen[resolved] = option
        folder = path.absolute().parent
        while not folder.exists():
            folder = folder.parent
        if not folder.is_dir():
            raise ValueError(f"{option} {value}: {folder} is a file, so it cannot hold {path.name}; expected a "
                             "path under a folder")
        target = path if path.exists() else folder
        if not os.access(target, os.W_OK):
            raise ValueError(f"{option} {value}: {target} is not writable; expected a path this user may write")


def make_parent(path: str) -> Path:
    """The path, its folder created (checked by `check_output_paths` first)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return p
