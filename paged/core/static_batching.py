"""The traditional baseline the article compares paging against: static batching.

Each request reserves contiguous KV for its whole possible length (prompt + max_tokens, or
max_model_len) when its batch starts. A batch is formed when `batch_size` requests wait or the
head of the queue (the oldest, under FCFS) has waited `batch_timeout_s` (the article's 10 ms
default), is prefilled padded to its longest prompt, and decodes every slot — finished or not —
until its longest member is done;
only then are its results returned and its memory released. No chunking, no prefix caching,
no preemption: the reservation makes them unnecessary, which is exactly what wastes memory.

It implements the same driver contract (`BaseScheduler`) as `Scheduler`, so the simulator runs
both unchanged.
"""
from __future__ import annotations

from .config import CacheConfig, SchedulerConfig
from .request import Request, RequestStatus
from .scheduler_base import BaseScheduler
from .scheduler_output import SchedulerOutput

RESERVE_MODES = ("max_tokens", "max_model_len")


class StaticBatchScheduler(BaseScheduler):
    """Its limits are its own. `batch_size` is the number of sequences in every step, so it may
    not exceed `max_num_seqs` (refused at construction). `max_num_batched_tokens` does not apply:
    a static batch is prefilled whole, padded to its longest prompt, in one step (batch_size x
    the longest prompt tokens), because chunking a prefill is exactly what the baseline cannot do.

    Latency as a client sees it, streaming: the first token ends the prefill (TTFT), and a
    request that stops before its batch gets its last token then, not when the batch ends. So
    each request keeps the time of its last token (`last_token_time`, reported by
    `last_token_time()`), and its TPOT is the mean gap between its first and last tokens; its
    `finished_time` stays the end of the batch, when its memory is released and its result
    returned."""

    def __init__(self, cache_config: CacheConfig, scheduler_config: SchedulerConfig, batch_size: int = 8,
                 batch_timeout_s: float = 0.010, reserve: str = "max_tokens") -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"StaticBatchScheduler batch_size={batch_size!r}: expected an integer >= 1")
        if batch_timeout_s < 0:
            raise ValueError(f"StaticBatchScheduler batch_timeout_s={batch_timeout_s!r}: expected >= 0")
        if reserve not in RESERVE_MODES:
            raise ValueError(f"StaticBatchScheduler reserve={reserve!r}: expected one of {list(RESERVE_MODES)}")
        if batch_size > scheduler_config.max_num_seqs:
            raise ValueError(f"StaticBatchScheduler batch_size={batch_size}: expected at most "
                             f"SchedulerConfig.max_num_seqs={scheduler_config.max_num_seqs} (every step runs the "
                             "whole batch)")
        super().__init__(cache_config, scheduler_config)
        self.batch_size = batch_size
        self.batch_timeout_s = batch_timeout_s
        self.reserve = reserve
        self.batch: list[Request] = []
        self._step = 0  # steps the current batch has taken: 0 = its prefill is next
        self._max_prompt = 0
        self._stopped: set[Request] = set()
        self._ended: list[Request] = []  # finished outside update_from_output, reported by the next one

    @property
    def num_running(self) -> int:
        return len(self.batch)

    def running_requests(self):
        return iter(self.batch)

    def _reserved_tokens(self, req: Request) -> int:
        return req.num_prompt_tokens + req.max_output_tokens if self.reserve == "max_tokens" else self.max_len

    def _reject_reason(self, request: Request) -> str | None:
        reason = super()._reject_reason(request)
        if reason is None and request.sampling_params.n > 1:
            reason = f"static batching does not do parallel sampling (n={request.sampling_params.n})"
        if reason is None and self._reserved_tokens(request) > self.capacity_tokens:
            reason = (f"a reservation of {self._reserved_tokens(request)} tokens can never fit in the KV cache "
                      f"({self.capacity_tokens} tokens)")
        return reason

    def _remove(self, req: Request) -> None:
        if req.status == RequestStatus.RUNNING:
            self.batch.remove(req)
            self._stopped.discard(req)
        elif req.status == RequestStatus.WAITING:
            self.waiting.discard(req)

    def _live(self, req: Request) -> bool:
        return req.num_output_base < req.max_output_tokens and req not in self._stopped

    def schedule(self, now: float) -> SchedulerOutput:
        out = SchedulerOutput([], [], [])
        if self.batch and not any(self._live(r) for r in self.batch):
            self._ended += self._end_batch(now)  # an abort or a stop string took its last live member
        if not self.batch and not self._form_batch(now, out):
            return out
        batch, B = self.batch, len(self.batch)
        if self._step == 0:
            p = self._max_prompt
            out.prefill_requests = list(batch)
            out.prefill_num_tokens = [r.num_prompt_tokens for r in batch]
            out.num_prefill_tokens = B * p  # padded to the longest prompt
            out.prefill_attention_pairs = B * p * (p + 1) // 2
        else:
            out.decode_requests = [r for r in batch if self._live(r)]
            out.num_decode_tokens = B  # every slot decodes, finished or not
            out.decode_context_sum = B * (self._max_prompt + self._step)
        self._count_step(B, out.num_scheduled_tokens)
        return out

    def _form_batch(self, now: float, out: SchedulerOutput) -> bool:
        head = self.waiting.peek()
        if head is None:
            return False
        if len(self.waiting) < self.batch_size and now < head.arrival_time + self.batch_timeout_s:
            out.next_wakeup = head.arrival_time + self.batch_timeout_s
            return False
        while len(self.batch) < self.batch_size and self.waiting:
            req = self.waiting.peek()
            if not self.kv.allocate_slots(req, self._reserved_tokens(req)):
                break
            self.waiting.pop()
            req.status = RequestStatus.RUNNING
            req.first_scheduled_time = now
            req.num_cached_tokens = 0
            self.batch.append(req)
        self._step = 0
        self._max_prompt = max(r.num_prompt_tokens for r in self.batch)
        return True

    def update_from_output(self, out: SchedulerOutput, sampled_tokens: dict[str, list[int]] | None = None,
                           now: float = 0.0) -> list[Request]:
        ended, self._ended = self._ended, []
        if out.is_empty:
            return ended
        if self._step == 0:
            for r in out.prefill_requests:
                if r.status == RequestStatus.RUNNING:
                    r.num_computed_base = r.num_prompt_tokens
                    r.num_output_base = 1
                    r.first_token_time = now
                    self._take_token(r, sampled_tokens, now)
        else:
            for r in out.decode_requests:
                if r.status == RequestStatus.RUNNING:
                    r.num_computed_base += 1
                    r.num_output_base += 1
                    self._take_token(r, sampled_tokens, now)
        self._step += 1
        return ended + self._end_batch_if_done(now)

    def _take_token(self, req: Request, sampled_tokens, now: float) -> None:
        req.last_token_time = now
        if sampled_tokens is not None:
            tok = sampled_tokens[req.request_id][0]
            req.output_token_ids.append(tok)
            if tok in req.stop_token_ids:
                self._stopped.add(req)

    def last_token_time(self, req: Request) -> float | None:
        return req.last_token_time

    def _end_batch_if_done(self, now: float) -> list[Request]:
        """Results come back when the whole batch is done, all at once."""
        return [] if any(self._live(r) for r in self.batch) else self._end_batch(now)

    def _end_batch(self, now: float) -> list[Request]:
        done = list(self.batch)
        for r in done:
            status = RequestStatus.FINISHED_STOPPED if r in self._stopped else RequestStatus.FINISHED_LENGTH
            self._finish(r, status, now)
        return done

    # -- the simulator's exact fast path ------------------------------------------------------
    def max_uniform_decode_steps(self) -> int:
        """Every decode step of a batch has the same shape until the batch ends; a window ends
        at the next live member's last token, so that its time is known."""
        if not self.batch or self._step == 0 or self._stopped:
            return 0
        return min((r.max_output_tokens - r.num_output_base for r in self.batch if self._live(r)), default=0)

    def advance_decode_steps(self, k: int, now: float) -> list[Request]:
        B = len(self.batch)
        for r in self.batch:
            if self._live(r):  # k steps, each one token (k is at most what any live member has left)
                r.num_computed_base += k
                r.num_output_base += k
                r.last_token_time = now
        self._count_step(B, B, k)
        self._step += k
        return self._end_batch_if_done(now)

    def uniform_step_shape(self) -> tuple[int, int]:
        B = len(self.batch)
        return B, B * (self._max_prompt + self._step)

    def uniform_step_tokens_out(self) -> int:
        return sum(1 for r in self.batch if self._live(r))

    def block_needs(self, k: int) -> list[int]:
        return [0] * k  # everything was reserved up front

    # -- figures ------------------------------------------------------------------------------
    def _num_computed_running(self) -> int:
        return sum(r.num_computed_base for r in self.batch)
