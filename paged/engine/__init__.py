"""The real engine: a Llama-family model on the paged KV cache, driven by the core's Scheduler.

    from paged.engine import LLM, SamplingParams

`SamplingParams` is the core's own class (re-exported, not copied): the scheduler reads its
`max_tokens`, `n` and stops, the engine's sampler the rest. Importing this package imports torch;
the core (`paged`) never does.
"""
from paged import SamplingParams

from .async_llm import AsyncLLM
from .engine import LLMEngine
from .engine_config import EngineConfig
from .llm import LLM
from .request_output import CompletionOutput, RequestMetrics, RequestOutput

__all__ = ["LLM", "AsyncLLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput", "CompletionOutput",
           "RequestMetrics"]
