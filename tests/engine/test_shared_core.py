"""The engine drives the core's own Scheduler and KVCacheManager: no subclass, no copy."""
import ast
from pathlib import Path

import paged
import paged.engine
from paged import CacheConfig, Request, RequestStatus, SchedulerConfig
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


def test_min_tokens_is_the_samplers_rule_not_the_schedulers():
    """What SamplingParams documents: the scheduler ends a sequence on a stop token it is handed,
    whatever min_tokens says; the engine's sampler holds min_tokens by never drawing one early
    (test_sampling.py::test_min_tokens_holds_off_stop_tokens_and_stop_strings), and the simulator,
    which hands no tokens, runs every request to its max_tokens."""
    params = SamplingParams(max_tokens=8, min_tokens=5, stop_token_ids=[7])
    handed = Scheduler(CacheConfig(num_gpu_blocks=8, block_size=4), SchedulerConfig(max_model_len=64))
    handed.add_request(req := Request("r", [1, 2, 3], sampling_params=params))
    assert handed.update_from_output(handed.schedule(0.0), {"r": [7]}, 0.0) == [req]
    assert req.status == RequestStatus.FINISHED_STOPPED and req.output_token_ids == [7]
    counted = Scheduler(CacheConfig(num_gpu_blocks=8, block_size=4), SchedulerConfig(max_model_len=64))
    counted.add_request(sim := Request("s", num_prompt_tokens=3, sampling_params=params))
    steps = 0
    while counted.has_unfinished_requests() and steps < 20:
        counted.update_from_output(counted.schedule(float(steps)), None, float(steps))
        steps += 1
    assert sim.status == RequestStatus.FINISHED_LENGTH and sim.num_output_tokens == 8
