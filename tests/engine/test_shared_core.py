"""The engine drives the core's own Scheduler and KVCacheManager: no subclass, no copy."""
import ast
from pathlib import Path

import paged
import paged.engine
from paged.core.kv_cache import KVCacheManager
from paged.core.scheduler import Scheduler
from paged.engine import LLM, SamplingParams

from .conftest import TINY

CORE_CLASSES = {"Scheduler", "BaseScheduler", "KVCacheManager", "BlockPool", "BlockTable", "DecodeBatch",
                "Request", "SamplingParams", "SchedulerOutput"}


def test_engine_uses_the_core_scheduler_class(tiny_llama):
    llm = LLM(str(tiny_llama[0]), **TINY)
    assert type(llm.scheduler) is Scheduler
    assert type(llm.scheduler.kv) is KVCacheManager
    assert paged.engine.SamplingParams is paged.SamplingParams
    assert llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))[0].finish_reason in ("length", "stop")


def test_engine_source_defines_no_scheduler_or_cache_manager():
    for file in Path(paged.engine.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
                assert node.name not in CORE_CLASSES, f"{file}: redefines {node.name}"
                assert not bases & CORE_CLASSES, f"{file}: {node.name} subclasses {bases & CORE_CLASSES}"
