"""LLMEngine: the real driver of the shared core.

The loop is the core's contract and nothing more:

    out = scheduler.schedule(now)
    sampled = runner.execute_model(out, scheduler.kv)     # block moves, forward, sampling
    finished = scheduler.update_from_output(out, sampled, now)

`scheduler` is a plain `paged.Scheduler` (the simulator drives the same class), so every
decision — admission, chunking, prefix hits, preemption by recompute or swap, copy-on-write —
is the core's; the engine only carries them out on real tensors. What only the engine can do
is here: tokenizing, rejecting bad input with a clear error before it reaches the core, ending
sequences on stop strings, and timing each request with `time.monotonic()`.
"""
from __future__ import annotations

import copy
import itertools
import time
import warnings
from collections.abc import Sequence

import torch

from paged import CacheConfig, Request, RequestStatus, SamplingParams, SchedulerConfig
from paged.core.scheduler import Scheduler
from paged.core.scheduler_base import BaseScheduler
from paged.core.validation import is_int

from .cache_engine import CacheEngine
from .engine_config import (
    DEFAULT_CPU_KV_CACHE_BYTES,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    EngineConfig,
)
from .loader import load_model
from .request_output import RequestOutput
from .request_state import RequestState
from .runner import ModelRunner
from .sampler import Sampler

Prompt = str | Sequence[int] | dict


def is_int_array(x) -> bool:
    """A 1-D numpy array (or anything array-like with one dimension) of integers."""
    return getattr(x, "ndim", None) == 1 and getattr(getattr(x, "dtype", None), "kind", None) in ("i", "u")


class KVCacheTooSmall(UserWarning):
    """A max_model_len given larger than the KV cache holds. The engine keeps it, and no sequence
    grows past the cache (tests shrink the cache so, to force preemption); `paged serve` makes
    this warning an error and refuses to start, as vLLM does."""

    def __init__(self, max_model_len: int, num_gpu_blocks: int, block_size: int) -> None:
        self.max_model_len, self.num_gpu_blocks, self.block_size = max_model_len, num_gpu_blocks, block_size
        self.capacity = capacity = num_gpu_blocks * block_size
        super().__init__(f"max_model_len={max_model_len} exceeds the KV cache's {capacity} tokens ({num_gpu_blocks} "
                         f"blocks of {block_size}): no sequence will grow past {capacity} tokens")


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        torch.set_num_threads(config.num_threads())
        self.device = device = config.torch_device()
        self.dtype = dtype = config.torch_dtype(device)
        loaded = load_model(config.model, tokenizer=config.tokenizer, dtype=dtype, device=device)
        self.model, self.model_config, self.tokenizer = loaded.model, loaded.config, loaded.tokenizer
        self.model_name = str(config.model)
        mc = self.model_config
        max_model_len = config.max_model_len or mc.max_model_len
        if max_model_len > mc.max_model_len:
            where = "sliding_window" if mc.max_model_len < mc.max_position_embeddings else "max_position_embeddings"
            raise ValueError(f"max_model_len={max_model_len} is greater than the model's maximum of {mc.max_model_len} "
                             f"tokens ({where} in its config): expected at most {mc.max_model_len} (left out, "
                             "it is the model's maximum)")
        chunked = config.enable_chunked_prefill
        max_tokens = config.max_num_batched_tokens or (
            DEFAULT_MAX_NUM_BATCHED_TOKENS if chunked else max(DEFAULT_MAX_NUM_BATCHED_TOKENS, max_model_len))
        block_bytes = CacheEngine.bytes_per_block(mc, config.block_size, dtype, config.kv_cache_dtype)
        # The bytes the KV cache was sized from (the CPU budget, given or default; on CUDA what
        # gpu_memory_utilization leaves), None when num_gpu_blocks sized it: /metrics shows it.
        self.kv_cache_memory_bytes = None if config.num_gpu_blocks else self._kv_budget(max_tokens)
        num_gpu_blocks = config.num_gpu_blocks or self.kv_cache_memory_bytes // block_bytes
        if num_gpu_blocks < 1:
            raise ValueError(f"the KV cache budget holds no block of {block_bytes} bytes: raise "
                             f"kv_cache_memory_bytes (CPU) or gpu_memory_utilization (CUDA)")
        capacity = num_gpu_blocks * config.block_size
        if max_model_len > capacity:
            if config.max_model_len is None:
                max_model_len = capacity
            else:
                warnings.warn(KVCacheTooSmall(max_model_len, num_gpu_blocks, config.block_size), stacklevel=3)
        num_cpu_blocks = config.num_cpu_blocks
        if num_cpu_blocks is None:
            num_cpu_blocks = int(config.swap_space * (1 << 30)) // block_bytes
            if not num_cpu_blocks and config.preemption_mode == "swap":
                num_cpu_blocks = num_gpu_blocks
        self.scheduler: BaseScheduler = Scheduler(
            CacheConfig(num_gpu_blocks=num_gpu_blocks, block_size=config.block_size, num_cpu_blocks=num_cpu_blocks,
                        enable_prefix_caching=config.enable_prefix_caching, watermark=config.watermark),
            SchedulerConfig(max_num_seqs=config.max_num_seqs or min(DEFAULT_MAX_NUM_SEQS, max_tokens),
                            max_num_batched_tokens=max_tokens, max_model_len=max_model_len,
                            enable_chunked_prefill=chunked,
                            long_prefill_token_threshold=config.long_prefill_token_threshold,
                            policy=config.policy, preemption_mode=config.preemption_mode),
        )
        self.cache = CacheEngine(mc, num_gpu_blocks, num_cpu_blocks, config.block_size, dtype, device,
                                 config.kv_cache_dtype, config.swap_compression)
        self.sampler = Sampler(config.seed)
        self.runner = ModelRunner(self.model, self.cache, self.sampler, device)
        self.requests: dict[str, RequestState] = {}  # unfinished, by the id the user knows
        self._by_root: dict[str, RequestState] = {}  # the same, by the scheduler's id of their first sequence
        self._ids = itertools.count()  # for requests the user did not name
        self._internal_ids = itertools.count()

    def _kv_budget(self, max_num_batched_tokens: int) -> int:
        """Bytes for the KV cache: the CPU budget as given; on CUDA, `gpu_memory_utilization` of the
        device less what is in use now (weights, other processes) and an allowance for the
        activations of the largest step (the fused MLP input, a few hidden-size tensors, logits)."""
        if self.device.type != "cuda":
            return self.config.kv_cache_memory_bytes or DEFAULT_CPU_KV_CACHE_BYTES
        mc = self.model_config
        free, total = torch.cuda.mem_get_info(self.device)
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        activations = 4 * max_num_batched_tokens * (2 * mc.intermediate_size + 6 * mc.hidden_size) * itemsize
        activations += 3 * DEFAULT_MAX_NUM_SEQS * mc.vocab_size * 4
        return int(total * self.config.gpu_memory_utilization) - (total - free) - activations

    # -- requests in and out ------------------------------------------------------------------
    def add_request(self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None,
                    arrival_time: float | None = None) -> str:
        """Queue a request; a ValueError naming the problem if it can never run (nothing is queued then).

        `request_id` is the user's name for it, any string not already in use here; the scheduler
        knows it under an internal id, so no user id can collide with the names the scheduler
        gives the sequences it forks for parallel sampling."""
        params = _checked(params)
        prompt_text, prompt_ids = self._tokenize(prompt)
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer, and this model has none")
        if request_id is None:
            request_id = self._free_id()
        elif not isinstance(request_id, str):
            raise ValueError(f"request id {request_id!r}: expected a string")
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        req = Request(str(next(self._internal_ids)), prompt_ids, sampling_params=params,
                      arrival_time=time.monotonic() if arrival_time is None else arrival_time,
                      eos_token_id=self.model_config.eos_token_ids or None)
        self.scheduler.add_request(req)
        if req.status == RequestStatus.REJECTED:
            raise ValueError(f"request {request_id!r} rejected: {req.stop_reason}")
        self.sampler.add_request(req.request_id, params)
        self.requests[request_id] = self._by_root[req.request_id] = RequestState(request_id, req, prompt_text,
                                                                                  self.tokenizer)
        return request_id

    def _free_id(self) -> str:
        """The next counter value not already taken by a user's request."""
        while (rid := str(next(self._ids))) in self.requests:
            pass
        return rid

    def tokens_prompt(self, prompt: Prompt) -> dict:
        """`prompt` as a TokensPrompt: its token ids, and its text where it has one (what
        `add_request` takes as it is). For a server that must know a prompt's length before
        queueing it; the ValueError `add_request` would raise for a bad prompt."""
        text, ids = self._tokenize(prompt)
        return {"prompt_token_ids": ids} if text is None else {"prompt": text, "prompt_token_ids": ids}

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        """A string is tokenized; any other sequence (list, tuple, 1-D array) is token ids, numpy
        integers included. A dict is vLLM's TextPrompt ({"prompt": text}) or TokensPrompt
        ({"prompt_token_ids": ids}); with both keys, the ids are the prompt and the text its text."""
        if isinstance(prompt, dict):
            keys = set(prompt)
            if not keys or not keys <= {"prompt", "prompt_token_ids"}:
                raise ValueError(f"prompt dict with keys {sorted(map(str, keys))}: expected 'prompt' and/or "
                                 f"'prompt_token_ids'")
            text = prompt.get("prompt")
            if "prompt" in keys and not isinstance(text, str):
                raise ValueError(f"prompt['prompt'] of type {type(text).__name__}: expected a string")
            if "prompt_token_ids" not in keys:
                return self._tokenize(text)
            ids = prompt["prompt_token_ids"]
            if isinstance(ids, str):
                raise ValueError("prompt['prompt_token_ids'] is a string: expected a list of token ids")
            return text, self._tokenize(ids)[1]
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty: expected at least one character or token")
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer (no tokenizer.json): give prompts as token ids")
            return prompt, self.tokenizer.encode(prompt)
        if not (isinstance(prompt, Sequence) or is_int_array(prompt)):
            raise ValueError(f"prompt of type {type(prompt).__name__}: expected a string or a list of token ids")
        ids = list(prompt)
        if not ids:
            raise ValueError("prompt is empty: expected at least one token id")
        vocab = self.model_config.vocab_size
        bad = next((t for t in ids if not is_int(t) or not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad!r}: expected integers in [0, {vocab})")
        return None, [int(t) for t in ids]

    def chat_prompt(self, messages, chat_template: str | None = None, add_generation_prompt: bool = True,
                    **template_kwargs) -> dict:
        """The prompt for chat `messages` (`Tokenizer.chat_prompt`): a TokensPrompt with its text, for add_request."""
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer (no tokenizer.json): chat needs one")
        return self.tokenizer.chat_prompt(messages, chat_template, add_generation_prompt, **template_kwargs)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request and all its sequences; their blocks are free when this returns.
        Returns its final output (finish_reason "abort" where it was still running), None if unknown."""
        state = self.requests.get(request_id)
        if state is None:
            return None
        now = time.monotonic()
        for seq in state.seqs:
            self.scheduler.abort(seq.request_id, now)
        # children forked in a step that failed before the engine adopted them
        for orphan in [r for r in self.scheduler.requests.values() if r.parent is state.root]:
            self.scheduler.abort(orphan.request_id, now)
        self._forget(state)
        return state.output()

    def _forget(self, state: RequestState) -> None:
        del self.requests[state.request_id], self._by_root[state.root.request_id]
        self.sampler.free_request(state.root.request_id, state.params.n)

    def owner(self, seq: Request) -> str | None:
        """The user's id of the request a scheduler sequence belongs to; None if no live request has it."""
        state = self._by_root.get((seq.parent or seq).request_id)
        return None if state is None else state.request_id

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- the step -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduler step; outputs (cumulative) of the requests that moved, finished ones included."""
        scheduler = self.scheduler
        out = scheduler.schedule(time.monotonic())
        sampled = self.runner.execute_model(out, scheduler.kv)
        now = time.monotonic()
        finished = scheduler.update_from_output(out, sampled, now)
        moved: dict[str, RequestState] = {}
        for req in itertools.chain(out.decode_requests, out.prefill_requests, finished):
            root = req.parent or req
            state = self._by_root.get(root.request_id)
            if state is not None and state.root is root:
                moved[root.request_id] = state
        outputs = []
        for state in moved.values():
            if len(state.seqs) < state.params.n and state.root.num_output_tokens:
                self._adopt_children(state, finished)
            for seq in state.read_new_tokens():
                scheduler.finish_request(seq.request_id, now)
            outputs.append(state.output())
            if state.finished:
                self._forget(state)
        return outputs

    def _adopt_children(self, state: RequestState, finished: list[Request]) -> None:
        """The scheduler forked the root after its prompt: follow the n - 1 new sequences too.
        They are found by `parent`, not by name (the core renames a child whose id is taken);
        one that finished in the fork's own step is no longer in the scheduler, but in `finished`."""
        root = state.root
        children = [r for r in itertools.chain(self.scheduler.requests.values(), finished) if r.parent is root]
        for child in sorted(children, key=lambda r: r.index):
            state.add_sequence(child)


def _checked(params: SamplingParams | None) -> SamplingParams:
    """A private, re-validated copy: the dataclass checks only at construction, and a caller may
    have changed a field since (or may change it while the request runs)."""
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise ValueError(f"sampling params of type {type(params).__name__}: expected paged.SamplingParams")
    params = copy.copy(params)
    params.validate()
    return params
