"""The contract between the core and its drivers, in code, and what every scheduler shares.

A driver (the simulator's `sim.replica.Replica`, the engine's `LLMEngine`) holds a
`BaseScheduler` and runs this loop; it never reaches into the scheduler's queues:

    scheduler.add_request(request)
    out = scheduler.schedule(now)                      # which requests run how many tokens
    tokens = driver.run(out)                           # cost model, or model forward + sampler
    finished = scheduler.update_from_output(out, tokens, now)

The simulator may also take k identical decode steps at once (the fast path:
`max_uniform_decode_steps`, `uniform_step_shape`, `block_needs`, `advance_decode_steps`),
which must leave the state exactly as k rounds of the loop would. docs/architecture.md draws it.

What is shared here: the request registry, rejection of requests that can never run, aborts,
counters and statistics. `Scheduler` (continuous batching) and `StaticBatchScheduler` (the
traditional baseline) differ only in how they schedule.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from .config import CacheConfig, SchedulerConfig
from .kv_cache import KVCacheManager
from .metrics import SchedulerStats
from .policies import make_policy
from .request import FINISHED_ABORTED, FINISHED_STOPPED, REJECTED, WAITING, Request, RequestStatus
from .request_queue import KVTellingQueue, RequestQueue
from .scheduler_output import SchedulerOutput


class BaseScheduler(ABC):
    def __init__(self, cache_config: CacheConfig, scheduler_config: SchedulerConfig) -> None:
        scheduler_config.check_block_size(cache_config.block_size)
        self.cache_config = cache_config
        self.config = scheduler_config
        self.block_size = cache_config.block_size
        self.kv = KVCacheManager(cache_config)
        self.policy = make_policy(scheduler_config.policy)
        # over a queue-aware pool, the waiting queue tells the KV cache who waits where
        queue_aware = cache_config.eviction == "queue" and cache_config.enable_prefix_caching
        self.waiting = (KVTellingQueue if queue_aware else RequestQueue)(self.policy, WAITING, self.kv)
        self.requests: dict[str, Request] = {}  # unfinished requests by id
        self.capacity_tokens = cache_config.num_gpu_slots
        self.max_len = min(scheduler_config.max_model_len, self.capacity_tokens)
        self._seq = 0
        self.num_preemptions = 0
        self.num_finished = 0
        self.num_rejected = 0
        self.num_aborted = 0
        self.num_steps = 0
        self.num_scheduled_seqs = 0  # summed over steps: effective batch size = this / num_steps
        self.num_scheduled_tokens = 0
        self.last_batch_size = 0

    # -- the driver's loop -----------------------------------------------------------------------
    @abstractmethod
    def schedule(self, now: float) -> SchedulerOutput:
        """Decide the next step: which requests run how many tokens, which were preempted,
        swapped or finished, which blocks to copy. `now` is the driver's clock (seconds)."""

    @abstractmethod
    def update_from_output(self, out: SchedulerOutput, sampled_tokens: dict[str, list[int]] | None = None,
                           now: float = 0.0) -> list[Request]:
        """Account for the step `out` once it ran: `sampled_tokens` maps request ids to the
        tokens sampled (the engine), or is None for synthetic tokens (the simulator). Returns
        the requests that finished."""

    # -- the simulator's exact fast path ------------------------------------------------------
    @abstractmethod
    def max_uniform_decode_steps(self) -> int:
        """How many next steps are pure decode with nothing changing (0 when the next is not).
        Valid between `update_from_output` and the next `schedule`."""

    @abstractmethod
    def uniform_step_shape(self) -> tuple[int, int]:
        """(num_decode_tokens, decode_context_sum) of the next decode step; each later step of a
        uniform window adds num_decode_tokens to the context sum."""

    def uniform_step_tokens_out(self) -> int:
        """Tokens each step of a uniform window gives to clients: one per decode slot, unless
        slots decode padding (a static batch's members that have stopped), which no client
        receives and no inter-token latency counts."""
        return self.uniform_step_shape()[0]

    @abstractmethod
    def block_needs(self, k: int) -> list[int]:
        """New blocks each of the next k uniform decode steps allocates."""

    @abstractmethod
    def advance_decode_steps(self, k: int, now: float) -> list[Request]:
        """Take k uniform decode steps at once (k <= max_uniform_decode_steps()), with synthetic
        tokens: identical to k rounds of schedule/update. `now` is the end of the last step."""

    def arrivals_change_nothing(self) -> bool:
        """Whether requests arriving during the next max_uniform_decode_steps() steps would leave
        them as they are (each would only queue behind a head that cannot be admitted before they
        end), so that a driver may take them without stopping at each arrival. False unless a
        scheduler knows better."""
        return False

    # -- hooks for the concrete schedulers ----------------------------------------------------
    @property
    @abstractmethod
    def num_running(self) -> int: ...

    @abstractmethod
    def running_requests(self):
        """The requests that may take part in the next step (an iterable)."""

    @abstractmethod
    def _remove(self, req: Request) -> None:
        """Take an unfinished request out of the scheduler's queues and batches."""

    def _changed(self) -> None:
        """A request arrived or left: whatever the scheduler concluded about admission is stale.
        Nothing to do by default (static batching concludes nothing between batches)."""
        return None

    def _queued(self, request: Request) -> None:
        """A request joined the waiting queue: by default, as any change, it makes stale what the
        scheduler concluded about admission."""
        self._changed()

    def _reject_reason(self, request: Request) -> str | None:
        p = request.num_prompt_tokens
        if p > self.config.max_model_len:
            return f"prompt of {p} tokens exceeds max_model_len={self.config.max_model_len}"
        if p > self.capacity_tokens:
            return (f"prompt of {p} tokens can never fit in the KV cache "
                    f"({self.cache_config.num_gpu_blocks} blocks of {self.block_size} tokens)")
        if request.sampling_params.n > self.config.max_num_seqs:
            return f"n={request.sampling_params.n} exceeds max_num_seqs={self.config.max_num_seqs}"
        return None

    # -- requests in and out ------------------------------------------------------------------
    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def add_request(self, request: Request) -> None:
        """Queue a request, or reject it (status REJECTED, reason in `stop_reason`, counted)
        when it can never run: its prompt exceeds max_model_len or the whole cache."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the scheduler")
        request.seq = self._seq
        self._seq += request.sampling_params.n  # room for the sequences it may fork into
        # The output stops at max_model_len (and at the cache's size): no request can outgrow
        # the cache on its own, which is what makes preemption always able to make progress.
        room = self.max_len - request.num_prompt_tokens
        max_tokens = request.sampling_params.max_tokens
        request.max_output_tokens = max_tokens if max_tokens <= room else room if room > 1 else 1
        reason = self._reject_reason(request)
        if reason is not None:
            request.status = REJECTED
            request.stop_reason = reason
            self.num_rejected += 1
            return
        self.requests[request.request_id] = request
        self.waiting.push(request)
        self._queued(request)

    def abort(self, request_id: str, now: float | None = None) -> Request | None:
        """Stop a request in any state and release all its blocks."""
        req = self.requests.get(request_id)
        if req is not None:
            self._finish(req, FINISHED_ABORTED, now)
        return req

    def finish_request(self, request_id: str, now: float, status=FINISHED_STOPPED) -> None:
        """For the driver: end a request for a reason only it can see (a stop string)."""
        req = self.requests.get(request_id)
        if req is not None:
            self._finish(req, status, now)

    def last_token_time(self, req: Request) -> float | None:
        """When a finished request's client got its last token: its finish, for a scheduler that
        ends each request at its last token (a static batch ends it later, see StaticBatchScheduler)."""
        return req.finished_time

    def _finish(self, req: Request, status: RequestStatus, now: float | None) -> None:
        self._remove(req)
        self.kv.free(req)
        req.status = status
        req.finished_time = now
        del self.requests[req.request_id]
        if status == FINISHED_ABORTED:
            self.num_aborted += 1
        else:
            self.num_finished += 1
        self._changed()

    def _count_step(self, num_seqs: int, num_tokens: int, k: int = 1) -> None:
        self.num_steps += k
        self.num_scheduled_seqs += k * num_seqs
        self.num_scheduled_tokens += k * num_tokens
        self.last_batch_size = num_seqs

    # -- figures ------------------------------------------------------------------------------
    @abstractmethod
    def _num_computed_running(self) -> int: ...

    def _queue_depth(self) -> tuple[int, int]:
        """(waiting, swapped)"""
        return len(self.waiting), 0

    def stats(self) -> SchedulerStats:
        kv = self.kv
        computed = self._num_computed_running()
        slots = kv.num_table_slots
        used_slots = kv.pool.num_used_blocks * self.block_size
        waiting, swapped = self._queue_depth()
        return SchedulerStats(
            num_requests_running=self.num_running,
            num_requests_waiting=waiting,
            num_requests_swapped=swapped,
            kv_cache_usage_perc=kv.usage,
            kv_cache_tokens_perc=max(0, used_slots - (slots - computed)) / self.capacity_tokens,
            fragmentation=(slots - computed) / slots if slots else 0.0,
            prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
            num_finished=self.num_finished,
            num_rejected=self.num_rejected,
            num_aborted=self.num_aborted,
            num_steps=self.num_steps,
            effective_batch_size=self.last_batch_size,
            queue_depth=waiting + swapped,
        )
