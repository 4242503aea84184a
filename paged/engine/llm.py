"""LLM: offline batched generation, as vLLM users write it.

    from paged.engine import LLM, SamplingParams
    llm = LLM(model="smollm2-135m")
    outputs = llm.generate(["Hello, my name is"], SamplingParams(temperature=0, max_tokens=16))

All prompts are queued before the first step, so the scheduler sees the whole batch and
continuous batching does the rest. A bad prompt raises a ValueError naming its index before
any step runs, and leaves the engine as it was.

A prompt longer than max_model_len is refused; a `max_tokens` that would take a sequence past
it is not: the sequence stops at max_model_len with finish_reason "length", as in vLLM's `LLM`
(a batch job wants its outputs, not an error). `paged serve` refuses such a request with a 400
instead, as vLLM's OpenAI server does (`paged.serve.protocol.fit_context`).
"""
from __future__ import annotations

from collections.abc import Sequence

from paged import SamplingParams
from paged.core.scheduler import Scheduler
from paged.core.validation import is_int

from .engine import LLMEngine, Prompt, is_int_array
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

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """One output per prompt, in order. A prompt is a string, a sequence of token ids (list,
        tuple or 1-D array, numpy integers included), or a dict as vLLM's TextPrompt/TokensPrompt;
        one prompt or a list of them."""
        prompts = _batch(prompts)
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

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None, *,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """vLLM's `LLM.chat`: one conversation (a list of {"role", "content"} messages) or a list of
        them, each rendered with the model's chat template (or `chat_template`) and generated.
        One RequestOutput per conversation; malformed messages raise a ValueError naming them."""
        batch = messages if isinstance(messages, list) and messages and isinstance(messages[0], list) else [messages]
        engine = self.llm_engine
        prompts = []
        for i, conversation in enumerate(batch):
            try:
                prompts.append(engine.chat_prompt(conversation, chat_template, add_generation_prompt,
                                                  **(chat_template_kwargs or {})))
            except ValueError as e:
                raise ValueError(f"conversation {i}: {e}" if len(batch) > 1 else str(e)) from e
        return self.generate(prompts, sampling_params)


def _batch(prompts) -> list:
    """vLLM's reading of `prompts`: a string, a dict, or a sequence of integers is one prompt;
    any other sequence is a list of prompts."""
    if isinstance(prompts, (str, dict)) or is_int_array(prompts):
        return [prompts]
    if isinstance(prompts, Sequence):
        if prompts and all(is_int(t) for t in prompts):
            return [prompts]
        return list(prompts)
    raise ValueError(f"prompts of type {type(prompts).__name__}: expected a prompt or a list of prompts")
