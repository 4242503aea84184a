"""What the scheduler needs to know about a request, and nothing it does not.

A request carries either real token ids (the engine) or only a prompt length, optionally with
precomputed prefix hash ids (simulator traces such as Mooncake's). Steady-decode requests are
advanced as a group by `DecodeBatch`: while a request belongs to it, its counters are stored
relative to the batch clock and read through properties, so a decode step does not touch it.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from .validation import is_int, is_number


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5
    REJECTED = 6

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


# The members as plain module names for the hot paths: reading an enum member off its class costs
# ~80 ns in CPython 3.11 (a descriptor call), a module global ~10 ns.
WAITING, RUNNING, SWAPPED, FINISHED_STOPPED, FINISHED_LENGTH, FINISHED_ABORTED, REJECTED = RequestStatus

FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.REJECTED: "rejected",
}


@dataclass(slots=True)
class SamplingParams:
    """Sampling parameters as vLLM names them, checked here so that every driver refuses the
    same bad values: at construction, and again by `validate()`, which a driver calls on its own
    copy where a request enters (a caller may change a field later).

    Who honours which field. The scheduler reads `max_tokens` and `n`, and ends a sequence on a
    stop token (`stop_token_ids`, and EOS unless `ignore_eos`) among the tokens its driver hands
    it, whatever the sequence's length. Choosing the tokens is the sampling driver's: the engine
    (`paged.engine`, torch) applies `temperature`, `top_k`, `top_p` and `seed`, ends sequences on
    `stop` strings, and enforces `min_tokens` (vLLM's): until a sequence has that many output
    tokens, its sampler never draws EOS or a stop token and stop strings are ignored, so the
    scheduler is never handed an early stop. A driver that samples without that rule gets no
    `min_tokens` from the scheduler. The simulator samples nothing: every request runs to its
    `max_tokens` (the trace's output length, so `min_tokens` <= `max_tokens` holds it), and no
    field but `max_tokens` and `n` changes a simulation.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    n: int = 1
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field, raising a ValueError that names the first bad one; normalize the
        accepted spellings (a stop string -> [it], None -> [], top_k=-1 -> 0, numpy numbers ->
        Python's) into fresh lists and plain values, so the caller's lists are never shared."""
        if self.stop is None or isinstance(self.stop, str):
            self.stop = [self.stop] if self.stop else []
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if self.top_k == -1:  # vLLM's spelling of "off", as 0 is here
            self.top_k = 0
        checks = [
            (is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens", "an integer >= 1"),
            (is_int(self.min_tokens) and 0 <= self.min_tokens <= (self.max_tokens if is_int(self.max_tokens) else 0),
             "min_tokens", f"an integer in [0, max_tokens={self.max_tokens!r}]"),
            (is_number(self.temperature) and 0.0 <= self.temperature < math.inf, "temperature", "a finite number >= 0"),
            (is_int(self.top_k) and self.top_k >= 0, "top_k", "an integer >= 0 (0 or -1 = off)"),
            (is_number(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", "a number in (0, 1]"),
            (is_int(self.n) and self.n >= 1, "n", "an integer >= 1"),
            # a per-sequence generator is seeded with seed + its index: keep it in torch's range
            (self.seed is None or (is_int(self.seed) and 0 <= self.seed < 2**62), "seed",
             "None or an integer in [0, 2**62)"),
            (isinstance(self.stop, (list, tuple)) and all(isinstance(x, str) and x for x in self.stop), "stop",
             "a string or a list of non-empty strings"),
            (isinstance(self.stop_token_ids, (list, tuple, set, frozenset))
             and all(is_int(x) and x >= 0 for x in self.stop_token_ids), "stop_token_ids",
             "a list of integers >= 0"),
            (isinstance(self.ignore_eos, bool), "ignore_eos", "True or False"),
        ]
        for ok, name, expected in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{name}={getattr(self, name)!r}: expected {expected}")
        self.max_tokens, self.min_tokens, self.top_k, self.n = (
            int(self.max_tokens), int(self.min_tokens), int(self.top_k), int(self.n))
        self.temperature, self.top_p = float(self.temperature), float(self.top_p)
        self.seed = None if self.seed is None else int(self.seed)
        self.stop = list(self.stop)
        self.stop_token_ids = [int(x) for x in self.stop_token_ids]


class Request:
    """One sequence the scheduler serves.

    `num_computed_tokens` counts tokens whose KV is in the cache; `num_tokens` counts prompt plus
    output. A request is decode-ready when exactly its last token is not yet computed.
    """

    __slots__ = (
        "request_id", "prompt_token_ids", "num_prompt_tokens", "prefix_hash_ids", "hash_id_block_size",
        "hash_ids_cover_output",
        "sampling_params", "stop_token_ids", "arrival_time", "priority", "business_value", "deadline",
        "expected_output_tokens", "extra_keys", "max_output_tokens",
        "status", "stop_reason", "output_token_ids", "block_hashes",
        "num_computed_base", "num_output_base", "decode_batch", "batch_clock0", "finish_clock",
        "num_preemptions", "num_cached_tokens", "first_scheduled_time", "first_token_time",
        "finished_time", "last_token_time", "parent", "index", "seq", "has_content",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int] | None = None,
        *,
        num_prompt_tokens: int | None = None,
        sampling_params: SamplingParams | None = None,
        max_tokens: int | None = None,
        arrival_time: float = 0.0,
        prefix_hash_ids: list[int] | None = None,
        hash_id_block_size: int = 512,
        hash_ids_cover_output: bool = False,
        priority: int = 0,
        business_value: float = 0.0,
        deadline: float = math.inf,
        expected_output_tokens: int | None = None,
        extra_keys: tuple = (),
        eos_token_id: int | tuple[int, ...] | None = None,
    ) -> None:
        if prompt_token_ids is not None:
            prompt_token_ids = list(prompt_token_ids)
            if num_prompt_tokens is not None and num_prompt_tokens != len(prompt_token_ids):
                raise ValueError(f"request {request_id}: num_prompt_tokens={num_prompt_tokens} "
                                 f"but {len(prompt_token_ids)} prompt token ids were given")
            num_prompt_tokens = len(prompt_token_ids)
        if num_prompt_tokens is not None and not is_int(num_prompt_tokens):
            raise ValueError(f"request {request_id}: num_prompt_tokens={num_prompt_tokens!r}: expected an integer")
        if not num_prompt_tokens or num_prompt_tokens < 1:
            raise ValueError(f"request {request_id}: empty prompt (num_prompt_tokens={num_prompt_tokens!r}); "
                             "expected at least one token")
        if sampling_params is None:
            sampling_params = SamplingParams(max_tokens=max_tokens if max_tokens is not None else 16,
                                             ignore_eos=True)
        elif max_tokens is not None:
            raise ValueError(f"request {request_id}: give max_tokens or sampling_params, not both")
        if prefix_hash_ids is not None and hash_id_block_size < 1:
            raise ValueError(f"request {request_id}: hash_id_block_size={hash_id_block_size}: expected >= 1")
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.num_prompt_tokens = num_prompt_tokens
        self.prefix_hash_ids = prefix_hash_ids
        # Whether its blocks can be named for prefix caching: a length-only trace row cannot.
        self.has_content = prompt_token_ids is not None or prefix_hash_ids is not None
        self.hash_id_block_size = hash_id_block_size
        # Whether the hash ids name the output too (a conversation's next turn names this answer) or
        # only the prompt (Mooncake's: the last id may name a block the output does not fill).
        self.hash_ids_cover_output = hash_ids_cover_output
        self.sampling_params = sampling_params
        # The tokens that end this request: the user's stop ids, and EOS (some models have
        # several) unless ignore_eos.
        stops = frozenset(sampling_params.stop_token_ids)
        if eos_token_id is not None and not sampling_params.ignore_eos:
            stops = stops.union((eos_token_id,) if isinstance(eos_token_id, int) else eos_token_id)
        self.stop_token_ids = stops
        self.arrival_time = arrival_time
        self.priority = priority
        self.business_value = business_value
        self.deadline = deadline
        self.expected_output_tokens = expected_output_tokens
        self.extra_keys = extra_keys
        # Output limit after max_model_len and cache capacity are applied (set on admission).
        self.max_output_tokens = sampling_params.max_tokens
        self.status = WAITING
        self.stop_reason: str | None = None
        # Real sampled tokens (engine); the simulator only counts them.
        self.output_token_ids: list[int] = []
        self.block_hashes: list = []
        # Owned by the schedulers (paged.core only): while the request sits in a `DecodeBatch`,
        # its counts advance with the batch's clock instead of per request, so a decode step
        # costs O(1) per batch. Read the counts through `num_computed_tokens` and
        # `num_output_tokens`, which add the batch's progress since `batch_clock0`.
        self.num_computed_base = 0
        self.num_output_base = 0
        self.decode_batch = None
        self.batch_clock0 = 0
        self.finish_clock = -1
        self.num_preemptions = 0
        self.num_cached_tokens = -1
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finished_time: float | None = None
        # when its last token was sampled; not kept up to date while it is in the decode batch
        # (where each step's end is a token), only when it leaves or samples elsewhere
        self.last_token_time: float | None = None
        self.parent: Request | None = None
        self.index = 0
        # Order of arrival in its scheduler, the n sequences of a parallel-sampling request
        # numbered in a row: the last word of every policy's key. A strict order: of two
        # requests one always ranks below the other, so two that each need room the other holds
        # never both wait (a deadlock).
        self.seq = 0

    # -- counters, lazy while the request is in the decode batch --------------------------------
    @property
    def num_computed_tokens(self) -> int:
        b = self.decode_batch
        return self.num_computed_base if b is None else self.num_computed_base + b.clock - self.batch_clock0

    @property
    def num_output_tokens(self) -> int:
        b = self.decode_batch
        return self.num_output_base if b is None else self.num_output_base + b.clock - self.batch_clock0

    @property
    def num_tokens(self) -> int:
        n = self.num_prompt_tokens + self.num_output_base  # num_output_tokens inlined: read at every admission
        b = self.decode_batch
        return n if b is None else n + b.clock - self.batch_clock0

    @property
    def is_finished(self) -> bool:
        return self.status >= FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def all_token_ids(self) -> list[int]:
        """Prompt plus output ids; only for requests that carry real tokens."""
        return self.prompt_token_ids + self.output_token_ids

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.name}, prompt={self.num_prompt_tokens}, "
                f"computed={self.num_computed_tokens}, output={self.num_output_tokens})")
