"""Checking a command's output paths before it works: a long run (a simulation, a search, a
real-time replay) must not end in a traceback that loses its results to a bad path. Shared by
`python -m sim` and `paged bench serve`, which write the same kinds of files."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def check_output_paths(outputs: list[tuple[str, str | None, str]]) -> None:
    """Each (option, path, example suffix) asked for (a None or empty path is not) can be written.
    Each must name a file, not a folder (one that exists, or a path ending in a slash); its folder
    may be missing (the command creates it), but then the nearest existing ancestor must be a
    writable folder, not a file. Two outputs may not share a path (one would overwrite the other).
    Raises ValueError naming the option and path."""
    seen: dict[Path, str] = {}
    for option, value, suffix in outputs:
        if not value:
            continue
        path = Path(value)
        if path.is_dir():
            raise ValueError(f"{option} {value}: is a folder; expected a file path, such as {path / ('out' + suffix)}")
        if value.endswith(("/", os.sep)):  # Path drops the slash, and a file of the folder's name was written
            raise ValueError(f"{option} {value}: ends in a slash, so it names a folder; expected a file path, such as "
                             f"{path / ('out' + suffix)}")
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
        try:
            probe(path, folder)
        except OSError as e:
            raise ValueError(f"{option} {value}: cannot write it ({e.strerror or e}); expected a path this user may "
                             "write") from None


def probe(path: Path, folder: Path) -> None:
    """Write access tried, not asked: os.access says yes to root for a read-only or virtual file
    system (/sys, a read-only mount), whose write failed only after the run. An existing file is
    opened for appending (its content kept); a missing one is created in its folder and removed; a
    missing folder's nearest existing ancestor gets a folder made and removed. What exists and is not
    a file (a pipe, `--json >(jq .)`'s /dev/fd/N; /dev/null) is only asked: opening a pipe waits for a
    reader, and closing it ends the reader's input before the output is written."""
    if path.exists() and not path.is_file():
        if not os.access(path, os.W_OK):
            raise PermissionError(13, "Permission denied")
    elif path.exists():
        with open(path, "a"):
            pass
    elif folder == path.absolute().parent:
        with open(path, "x"):
            pass
        path.unlink()
    else:
        os.rmdir(tempfile.mkdtemp(dir=folder))


def make_parent(path: str) -> Path:
    """The path, its folder created (checked by `check_output_paths` first)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


@contextmanager
def written(option: str, path: str) -> Iterator[Path]:
    """The path to write `option`'s output to, its folder created; an OSError while writing (the
    disk filled during the run, the folder was removed) becomes a ValueError naming the option and
    path, the commands' one-line error, instead of a traceback naming neither."""
    try:
        yield make_parent(path)
    except OSError as e:
        raise ValueError(f"{option} {path}: cannot write it ({e.strerror or e})") from None
