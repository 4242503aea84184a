"""One way to check a setting, for every config in the project (core, engine, simulator).

Bad values raise `ValueError` naming the owner, the field, the value and what was expected
("CacheConfig.block_size=12: expected a power of two >= 1"), so a typo in a sweep or a request
fails at once, where it was made, instead of producing a strange result later.
"""
from __future__ import annotations

import numbers


def is_int(value) -> bool:
    """An integer (numpy's included, as sweeps produce them), and not a bool (True is an int to
    Python, never a block count to us)."""
    return type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


def is_number(value) -> bool:
    """A real number (numpy's included), and not a bool."""
    return type(value) in (int, float) or (isinstance(value, numbers.Real) and not isinstance(value, bool))


def is_power_of_two(value) -> bool:
    """Block sizes are: kernels tile them, and hash ids map onto them by division."""
    return is_int(value) and value >= 1 and value & (value - 1) == 0


class SettingError(ValueError):
    """A bad setting, with its parts kept, so that a command line can name its own option for the
    field (`sim.cli.option_errors`) while Python callers read the field's name."""

    def __init__(self, owner: str, field: str, value, expected: str) -> None:
        super().__init__(f"{owner}.{field}={value!r}: expected {expected}")
        self.owner, self.field, self.value, self.expected = owner, field, value, expected

    def __reduce__(self):  # rebuilt from its parts when it crosses a process (a search's workers)
        return type(self), (self.owner, self.field, self.value, self.expected)


def require(ok: bool, owner: str, field: str, value, expected: str) -> None:
    if not ok:
        raise SettingError(owner, field, value, expected)
