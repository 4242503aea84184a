"""Hypothesis profiles: `ci` keeps `make test` fast on two cores; `thorough` is for hunting bugs.

Choose with HYPOTHESIS_PROFILE=ci|thorough (the Makefile sets ci unless told otherwise).
"""
import os

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
