"""LLM: offline batched generation, as vLLM users write it.

    from paged.engine import LLM, SamplingParams
    llm = LLM(model="smollm2-135m")
    outputs = llm.generate(["Hello, my name is"], SamplingParams(temperature=0, max_tokens=16))

All prompts are queued before the first step, so the scheduler sees the whole batch and
continuous batching does the rest. A bad prompt raises a ValueError naming its index before
any step runs, and leaves the engine as it was.
"""
from __future__ import annotations

from paged import SamplingParams
from paged.core.scheduler import Scheduler

from .engine import LLMEngine, Prompt
from .engine_config import EngineConfig
from .request_output import RequestOutput


class LLM:
    def __init__(self, model: str, **kwargs) -> None:
        """`kwargs` are the fields of `EngineConfig` (dtype, seed, kv_cache_memory_bytes, max_num_seqs, ...)."""
        self.llm_engine = LLMEngine(EngineConfig(model=str(model), **kwargs))

    @property
    def scheduler(self) -> Scheduler:
        """The core's scheduler driving this engine (the very class the simulator drives)."""
        return self.llm_engine.scheduler

    @property
    def tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(self, prompts: Prompt | list[Prompt],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """One output per prompt, in order. A prompt is a string or a list of token ids."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts: expected one, or one each")
        engine = self.llm_engine
        ids: list[str] = []
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
                try:
                    ids.append(engine.add_request(prompt, p))
                except ValueError as e:
                    raise ValueError(f"prompt {i}: {e}") from e
            results: dict[str, RequestOutput] = {}
            pending = set(ids)
            while pending:
                for out in engine.step():
                    if out.finished and out.request_id in pending:
                        results[out.request_id] = out
                        pending.discard(out.request_id)
        except BaseException:
            for rid in ids:  # whatever went wrong, leave no request of this call behind
                engine.abort_request(rid)
            raise
        return [results[rid] for rid in ids]
