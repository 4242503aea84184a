"""Hypothesis profiles: `ci` keeps `make test` fast on two cores; `thorough` is for hunting bugs.

Choose with HYPOTHESIS_PROFILE=ci|thorough (the Makefile sets ci unless told otherwise). Also
`unwritable`, a folder no user may write in, root included.
"""
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
settings.register_profile(
    "thorough",
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def unwritable() -> Path:
    """sysfs, where no one creates a file, root included: a read-only folder stops only other users,
    and root is who asking os.access let through (tests and containers run as root)."""
    if not Path("/sys/kernel").is_dir():
        pytest.skip("no sysfs at /sys")
    return Path("/sys")
