"""The engine's CPU threads: set from EngineConfig.threads, with a default that leaves room for others.

(Why it matters: on a busy 2-core machine, torch's default of all cores made a 32-token request
take 24-38 s against 2 s with one thread. The test cannot time that; it checks the settings.)
"""
import os

import torch

from paged.engine import LLM
from paged.engine.engine_config import default_threads

from .conftest import TINY


def test_default_is_half_the_usable_cpus(monkeypatch):
    for cpus, expected in ((1, 1), (2, 1), (3, 1), (16, 8)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)))
        assert default_threads() == expected


def test_the_engine_sets_its_threads(tiny_llama, monkeypatch):
    before = torch.get_num_threads()
    try:
        LLM(str(tiny_llama[0]), threads=2, **TINY)
        assert torch.get_num_threads() == 2
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
        LLM(str(tiny_llama[0]), **TINY)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
