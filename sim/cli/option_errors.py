"""SimConfig's checks under the names a command line user typed: `--router kv-aware: expected ...`
rather than `SimConfig.router='kv-aware'`, a field name they never wrote.

SimConfig keeps its own message (Python callers set the field); the command line rewrites it here,
in one place, from the option whose `dest` is the field (`sim.cli.options`: dests are field names).
"""
from __future__ import annotations

import argparse

from paged.core.validation import SettingError


def option_of(field: str, parser: argparse.ArgumentParser) -> str | None:
    """The option of `parser` that sets SimConfig's `field` (None: a field only a config file sets)."""
    return next((a.option_strings[0] for a in parser._actions if a.dest == field and a.option_strings), None)


def shown(value) -> str:
    """A value as it is typed: kv-aware, 1,0,1, -1.0."""
    if isinstance(value, str):
        return value
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return repr(value)


def named_as_option(error: ValueError, parser: argparse.ArgumentParser, argv: list[str],
                    config: str | None = None) -> ValueError:
    """`error`, a SimConfig check's, named as the user set the field: the option as typed, the
    key of the --config file, or the option whose default it is; any other error as it is."""
    if not (isinstance(error, SettingError) and error.owner == "SimConfig"):
        return error
    option = option_of(error.field, parser)
    if option is None:
        return error
    typed = any(a == option or a.startswith(option + "=") for a in argv)
    if config and not typed:
        return ValueError(f"{config}: {error.field}={error.value!r}: expected {error.expected}")
    default = "" if typed else " (its default)"
    return ValueError(f"{option} {shown(error.value)}{default}: expected {error.expected}")
