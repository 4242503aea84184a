"""The continuous-batching scheduler shared by the simulator and the engine.

It implements the driver contract of `BaseScheduler` (`paged.core.scheduler_base`; the layers
and the loop are drawn in docs/architecture.md).

Each step, in this order: the decode batch takes one token per member (the budget always
covers it: max_num_batched_tokens >= max_num_seqs), and members crossing into a new block get
one, preempting the lowest-priority running request when the pool is empty; then running
prefills continue (chunked, in priority order); then swapped requests come back and waiting
ones are admitted while the budget, max_num_seqs and the blocks (above the watermark) allow.

The scheduler never reads a clock and never sleeps: time comes in as `now`. Steady-decode
requests live in a `DecodeBatch`, so a step's cost does not grow with the number of decoding
requests; `max_uniform_decode_steps` and `advance_decode_steps` give the simulator k such
steps at once, with the same result as k single steps.
"""
from __future__ import annotations

from itertools import chain

from .config import CacheConfig, SchedulerConfig
from .decode_batch import DecodeBatch
from .request import FINISHED_LENGTH, FINISHED_STOPPED, RUNNING, SWAPPED, WAITING, Request
from .request_queue import RequestQueue
from .scheduler_base import BaseScheduler
from .scheduler_output import SchedulerOutput


class Scheduler(BaseScheduler):
    def __init__(self, cache_config: CacheConfig, scheduler_config: SchedulerConfig) -> None:
        super().__init__(cache_config, scheduler_config)
        self.decode = DecodeBatch(cache_config.block_size)
        self.prefilling: dict[Request, None] = {}  # running requests scheduled one by one
        self.swapped = RequestQueue(self.policy, SWAPPED, self.kv)
        self._admission_blocked = False  # the last admission attempt failed for a lasting reason
        # Tokens one prompt may schedule in a step: the per-prompt cap only splits prompts when
        # chunking is on; without it prompts go whole.
        cfg = scheduler_config
        self._prefill_cap = ((cfg.long_prefill_token_threshold if cfg.enable_chunked_prefill else 0)
                             or cfg.max_num_batched_tokens)
        self._now = 0.0  # the time of the step being scheduled
        self._watermark_blocks = cache_config.watermark_blocks  # kept free at admission while anything runs
        # and, over a queue-aware pool, up to this many of the free blocks the waiting requests would hit
        # (no more attributes than needed: past 30 an instance's attribute reads all slow down)
        self._queue_reserve = cache_config.queue_reserve_blocks if self.waiting.tells_kv else 0
        # The running request the policy values least, with its victim key, while known: kept as
        # requests join the running set (`_start`), forgotten when it leaves it (see _pick_victim).
        self._lowest: tuple[Request, tuple] | None = None
        # Whether each output lists its decode requests (`SchedulerOutput.decode_requests`): a driver
        # that samples them needs the list; one that only counts (the simulator) turns this off and
        # reads `num_decode_tokens`, saving a copy of the whole batch at every step (2.4% of a run).
        self.list_decode_requests = True

    @property
    def num_running(self) -> int:
        return len(self.decode.members) + len(self.prefilling)

    def _changed(self) -> None:
        self._admission_blocked = False

    def _queued(self, req: Request) -> None:
        """An arrival that queues behind a head blocked for a lasting reason leaves it blocked: under
        a static order the head stays ahead of it, and what the head lacks (sequences, blocks) does
        not depend on who waits behind it. So the fast path keeps going across such arrivals."""
        if self._admission_blocked and self._next_queued() is req:
            self._admission_blocked = False

    def _remove(self, req: Request) -> None:
        st = req.status
        if st == RUNNING:
            self._stops_running(req)
            if req.decode_batch is not None:
                self.decode.leave(req)
            else:
                del self.prefilling[req]
            self.kv.cache_full_blocks(req, req.num_computed_base)
        elif st == WAITING:
            self.waiting.discard(req)
        elif st == SWAPPED:
            self.swapped.discard(req)

    # -- scheduling ---------------------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        kv, dec, policy = self.kv, self.decode, self.policy
        self._now = now
        out = SchedulerOutput([], [], [])

        # 1. Decode members crossing into a new block need one; preempt if the pool is empty.
        crossers = dec.crossers()
        if crossers and not kv.append_blocks((crossers,)):
            for req in list(crossers):
                if req.decode_batch is not dec:
                    continue  # preempted above to make room
                while not kv.append_block(req):
                    victim = self._pick_victim()
                    self._preempt(victim, out)
                    if victim is req:
                        break

        # 2. Running prefills (chunks, recomputes, first steps after a fork), by priority.
        cfg = self.config
        budget = cfg.max_num_batched_tokens - len(dec.members)
        threshold = self._prefill_cap
        if self.prefilling:
            for req in sorted(self.prefilling, key=policy.victim_key):
                if req.status != RUNNING or budget <= 0:
                    continue
                # (num_tokens of a request not decoding, from its own counts: the property is a
                # Python call made from C, at every step a prompt is chunked or waits for room)
                n = min(req.num_prompt_tokens + req.num_output_base - req.num_computed_base, budget, threshold)
                while not kv.allocate_slots(req, n):
                    victim = self._pick_victim(lower_than=req)
                    if victim is None:
                        n = 0  # wait for room; it keeps its blocks
                        break
                    budget += self._preempt(victim, out)
                if n:
                    self._schedule_prefill(req, n, out)
                    budget -= n

        # 3. Queued requests, swapped and waiting together in the policy's order, come back
        # (swap in) or are admitted. `blocked` says why the head could not be: "seqs" and
        # "blocks" last while nothing finishes, arrives or is aborted ("blocks" only under a
        # static order); "budget" may clear at the next step.
        blocked = None
        reserved = self._num_seqs_reserved()
        if not policy.static_order:
            self.waiting.step_begins()
            self.swapped.step_begins()
        while budget > 0:
            req = self._next_queued()
            if req is None or req in out.preempted:
                break  # a request preempted in this very step is not back before the next one
            seqs = self._seqs_of(req)
            if reserved + seqs > cfg.max_num_seqs:
                blocked, got = "seqs", reserved + seqs - cfg.max_num_seqs
            elif req.status == SWAPPED:
                blocked, got = self._swap_in(req, budget, threshold, out)
            else:
                blocked, got = self._admit(req, budget, threshold, now, out)
            if blocked is None:  # `got` tokens were scheduled
                budget -= got
                reserved += seqs
                continue
            # `got` is what is short: sequences or blocks
            victim = self._victim_for(req, blocked, got) if policy.preemptive and blocked != "budget" else None
            if victim is None:
                break
            reserved -= self._seqs_of(victim)
            budget += self._preempt(victim, out)
            blocked = None
        # A blocked head stays blocked while nothing finishes, arrives or is aborted, if the order
        # is static: for lack of sequences always; for lack of blocks unless lower-priority work
        # could be preempted for it (that work grows blocks as it decodes).
        self._admission_blocked = policy.static_order and (
            blocked == "seqs" or (blocked == "blocks" and not policy.preemptive))

        members = dec.members
        if self.list_decode_requests:
            out.decode_requests = list(members)
        out.num_decode_tokens = num_decode = len(members)
        out.decode_context_sum = dec.context_sum
        out.blocks_to_copy = kv.end_step()
        num_seqs = num_decode + len(out.prefill_requests)
        if num_seqs:
            self._count_step(num_seqs, num_decode + out.num_prefill_tokens)
        return out

    @staticmethod
    def _seqs_of(req: Request) -> int:
        """Sequences a request will run as: n for a parallel-sampling request not yet forked."""
        return req.sampling_params.n if req.parent is None and req.num_output_base == 0 else 1

    def num_waiting_seqs(self) -> int:
        """Sequences the waiting requests will run as: what a server's admission limit counts,
        since vLLM's engine queues a request of n samples as n requests."""
        return sum(self._seqs_of(r) for r in self.waiting) if self.waiting else 0

    def _num_seqs_reserved(self) -> int:
        """Running sequences, counting the children that running parents will fork into."""
        n = len(self.decode.members)
        for r in self.prefilling:
            n += self._seqs_of(r)
        return n

    def _next_queued(self) -> Request | None:
        """The better of the swapped head and the waiting head, by the policy's order."""
        w = self.waiting.peek()
        sw = self.swapped.peek() if self.swapped.num_requests else None
        if sw is None or w is None:
            return w if sw is None else sw
        key = self.policy.key
        return sw if key(sw, self.kv) <= key(w, self.kv) else w

    def _swap_in(self, req: Request, budget: int, threshold: int, out: SchedulerOutput) -> tuple[str | None, int]:
        """Bring a swapped request back: (None, tokens scheduled for it) or ("blocks", blocks short)."""
        kv = self.kv
        reserve = self._watermark_blocks if self.decode.members or self.prefilling else 0
        mapping = kv.swap_in(req, reserve)
        if mapping is None:
            return "blocks", kv.num_swapped_blocks(req) + reserve - kv.num_free_blocks
        self.swapped.pop()
        out.blocks_to_swap_in.extend(mapping)
        req.status = RUNNING
        kv.cache_full_blocks(req, req.num_computed_base)
        self._start(req)
        n = min(req.num_tokens - req.num_computed_base, budget, threshold)
        if not kv.allocate_slots(req, n):
            return None, 0  # back, but it waits (running, holding its blocks) for room
        self._schedule_prefill(req, n, out)
        return None, n

    def _admit(self, req: Request, budget: int, threshold: int, now: float,
               out: SchedulerOutput) -> tuple[str | None, int]:
        """Admit a waiting request with its prefix-cache hits: (None, tokens scheduled for it),
        ("blocks", blocks short) or ("budget", 0)."""
        kv = self.kv
        hits, num_hit = kv.get_computed_blocks(req)
        num_tokens = req.num_prompt_tokens + req.num_output_base  # num_tokens of a request not decoding
        n = n_new = num_tokens - num_hit
        if n > budget:  # min(n_new, budget, threshold), without a call: every admission asks
            n = budget
        if n > threshold:
            n = threshold
        if n < n_new and not self.config.enable_chunked_prefill:
            return "budget", 0
        reserve = self._watermark_blocks if self.decode.members or self.prefilling else 0
        if self._queue_reserve and (self.decode.members or self.prefilling):
            reserve += self._held_for_queue(hits)
        short = kv.try_allocate_slots(req, n, hits, reserve)
        if short:
            return "blocks", short
        self.waiting.pop()
        req.status = RUNNING
        req.num_computed_base = num_hit
        kv.record_prefix_query(num_tokens, num_hit)
        if req.num_cached_tokens < 0:
            req.num_cached_tokens = num_hit
        if req.first_scheduled_time is None:
            req.first_scheduled_time = now
        self._start(req)
        self._schedule_prefill(req, n, out)
        return None, n

    def _held_for_queue(self, hits) -> int:
        """What admitting a waiting request whose prefix hits are `hits` leaves free for the requests
        behind it: the free blocks their prompts would hit (its own hits it takes), up to the reserve."""
        held = self.kv.pool.num_kept - sum(b.ref_cnt == 0 for b in hits)
        return held if held < self._queue_reserve else self._queue_reserve

    def _schedule_prefill(self, req: Request, n: int, out: SchedulerOutput) -> None:
        out.prefill_requests.append(req)
        out.prefill_num_tokens.append(n)
        out.num_prefill_tokens += n
        out.prefill_attention_pairs += n * req.num_computed_base + n * (n + 1) // 2

    def _start(self, req: Request) -> None:
        """A request joins the running set (admitted, swapped in, forked): a possible victim."""
        self.prefilling[req] = None
        lowest = self._lowest
        if lowest is not None:
            key = self.policy.victim_key(req)
            if key > lowest[1]:
                self._lowest = (req, key)

    def _stops_running(self, req: Request) -> None:
        """A request leaves the running set (finished, aborted, preempted)."""
        if self._lowest is not None and self._lowest[0] is req:
            self._lowest = None  # the next pick scans the batch

    def running_requests(self):
        return chain(self.decode.members, self.prefilling)

    def _pick_victim(self, lower_than: Request | None = None) -> Request | None:
        """The running request the policy values least; with `lower_than`, only if it ranks
        below that request (a request never preempts its betters)."""
        key = self.policy.victim_key
        lowest = self._lowest
        if lowest is None:
            # A scan of the batch, only when the last one found left: a running prefill that waits
            # for room asks at every step, and the scans were 2% of a run. Victim keys never change
            # while a request runs, and no two are equal (`Request.seq`), so the lowest stays the
            # lowest until it leaves or a lower one joins.
            victim = max(self.running_requests(), key=key, default=None)
            if victim is None:
                return None
            lowest = self._lowest = (victim, key(victim))
        victim = lowest[0]
        if lower_than is not None and (victim is lower_than or lowest[1] <= key(lower_than)):
            return None
        return victim

    def _victim_for(self, req: Request, blocked: str, short: int) -> Request | None:
        """Preemptive policies: the lowest-priority running request to preempt for a queued one
        that is `short` sequences or blocks of being admitted — None when nobody ranks below it,
        or when preempting all who do would still not make room (a useless preemption only
        throws work away)."""
        vkey = self.policy.victim_key
        rank = vkey(req)
        lower = [r for r in self.running_requests() if vkey(r) > rank]
        have = 0
        for r in lower:
            have += self._seqs_of(r) if blocked == "seqs" else self.kv.num_exclusive_blocks(r)
            if have >= short:
                return max(lower, key=vkey)
        return None

    def _preempt(self, req: Request, out: SchedulerOutput) -> int:
        """Preempt a running request (swap or recompute); returns the budget it gave back."""
        kv = self.kv
        gave = 0
        self._stops_running(req)
        if req.decode_batch is not None:
            self.decode.leave(req)
            req.last_token_time = self._now  # its last decode step ended as this one is scheduled
            gave = 1
        else:
            del self.prefilling[req]
            i = next((i for i, r in enumerate(out.prefill_requests) if r is req), None)
            if i is not None:  # scheduled earlier in this very step: take it back
                n = out.prefill_num_tokens.pop(i)
                out.prefill_requests.pop(i)
                out.num_prefill_tokens -= n
                out.prefill_attention_pairs -= n * req.num_computed_base + n * (n + 1) // 2
                gave = n
        req.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(req)
        # Whatever this step allocated for it will not run: its copy-on-write and fresh blocks go.
        kv.undo_copy_on_write(req)
        kv.trim(req, req.num_computed_base)
        mapping = kv.swap_out(req) if self.config.preemption_mode == "swap" else None
        if mapping is not None:
            out.blocks_to_swap_out.extend(mapping)
            self.swapped.push(req)
        else:
            kv.cache_full_blocks(req, req.num_computed_base)
            kv.free(req)
            req.num_computed_base = 0
            self.waiting.push(req)
        return gave

    # -- results of a step --------------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, sampled_tokens: dict[str, list[int]] | None = None,
                           now: float = 0.0) -> list[Request]:
        """Apply a step's results. `sampled_tokens` maps request id -> the tokens sampled for it
        (one, or n for a parallel-sampling request finishing its prompt); the simulator passes
        None and tokens are only counted. Returns the requests that finished."""
        dec = self.decode
        finished: list[Request] = []
        stopped: list[Request] = []
        if sampled_tokens is not None:
            if out.num_decode_tokens and not out.decode_requests:
                raise ValueError("update_from_output: tokens sampled for a step whose output lists no decode "
                                 "requests (list_decode_requests is off); expected it on for a driver that samples")
            for req in out.decode_requests:
                if req.decode_batch is dec:
                    tok = sampled_tokens[req.request_id][0]
                    req.output_token_ids.append(tok)
                    if tok in req.stop_token_ids:
                        stopped.append(req)
        # Counters move with the clock, so members leave only after it has advanced.
        for req in dec.advance():
            if req.status == RUNNING and req not in stopped:
                self._finish(req, FINISHED_LENGTH, now)
                finished.append(req)
        for req in stopped:
            self._finish(req, FINISHED_STOPPED, now)
            finished.append(req)

        kv = self.kv
        num_cached = len(kv.pool.cached)
        for req, n in zip(out.prefill_requests, out.prefill_num_tokens, strict=True):
            if req.status != RUNNING or req.decode_batch is not None:
                continue  # aborted since the step was scheduled
            req.num_computed_base += n
            kv.cache_full_blocks(req, req.num_computed_base)
            if req.num_computed_base < req.num_prompt_tokens + req.num_output_base:  # num_tokens, not decoding
                continue  # more prompt to go
            toks = sampled_tokens[req.request_id] if sampled_tokens is not None else None
            family = self._fork(req, toks) if (req.sampling_params.n > 1 and req.parent is None
                                                 and req.num_output_base == 0) else [(req, toks)]
            for r, t in family:
                self._sampled(r, t, now, finished)
        if len(kv.pool.cached) != num_cached:
            self._changed()  # new prefix-cache entries may shorten what a blocked head needs
        return finished

    def _sampled(self, req: Request, toks, now: float, finished: list[Request]) -> None:
        """A request produced a token at the end of a non-decode step: finish it or let it decode."""
        req.num_output_base += 1
        req.last_token_time = now
        if req.first_token_time is None:
            req.first_token_time = now
        status = None
        if toks is not None:
            req.output_token_ids.append(toks[0])
            if toks[0] in req.stop_token_ids:
                status = FINISHED_STOPPED
        if status is None and req.num_output_base >= req.max_output_tokens:
            status = FINISHED_LENGTH
        if status is not None:
            self._finish(req, status, now)
            finished.append(req)
        elif not self.kv.last_block_shared(req):
            del self.prefilling[req]
            self.decode.join(req)
        # else: it stays in `prefilling`, so its next write goes through copy-on-write

    def _fork(self, parent: Request, toks) -> list[tuple[Request, list[int] | None]]:
        """Parallel sampling: n sequences share the prompt's blocks after its prefill. A child's
        hash ids name its prompt only: the output they may name is the parent's."""
        n = parent.sampling_params.n
        family = [(parent, toks[0:1] if toks is not None else None)]
        for i in range(1, n):
            child_id = f"{parent.request_id}-{i}"
            if child_id in self.requests:  # a user's request already has that name
                child_id = f"{child_id}#{self._seq}"
            child = Request(child_id, parent.prompt_token_ids,
                            num_prompt_tokens=parent.num_prompt_tokens, sampling_params=parent.sampling_params,
                            arrival_time=parent.arrival_time, prefix_hash_ids=parent.prefix_hash_ids,
                            hash_id_block_size=parent.hash_id_block_size, priority=parent.priority,
                            business_value=parent.business_value, deadline=parent.deadline,
                            expected_output_tokens=parent.expected_output_tokens, extra_keys=parent.extra_keys)
            child.stop_token_ids = parent.stop_token_ids
            child.parent, child.index, child.seq = parent, i, parent.seq + i  # just after its parent
            child.max_output_tokens = parent.max_output_tokens
            child.status = RUNNING
            child.num_computed_base = parent.num_computed_base
            child.num_cached_tokens = parent.num_cached_tokens
            child.first_scheduled_time = parent.first_scheduled_time
            self.kv.fork(parent, child)
            self.requests[child.request_id] = child
            self._start(child)
            family.append((child, toks[i:i + 1] if toks is not None else None))
        self._changed()  # new running sequences: new possible victims for a preemptive policy
        return family

    # -- the simulator's exact fast path ------------------------------------------------------
    def max_uniform_decode_steps(self) -> int:
        """How many next steps are pure decode with nothing changing: no prefill, no possible
        admission, no finish before the last of them, blocks enough for every boundary crossed.
        0 when the next step is not such a step. Valid between `update_from_output` and the
        next `schedule`, when no request was aborted since the last `schedule` (arrivals are
        accounted for: one that would be admitted first clears `_admission_blocked`)."""
        dec = self.decode
        if self.prefilling or not dec.members:
            return 0
        if ((self.waiting.num_requests or self.swapped.num_requests) and not self._admission_blocked
                and not self._head_stays_blocked()):
            return 0
        k = dec.steps_to_next_finish()
        return dec.steps_with_blocks(self.kv.pool.num_free_blocks, k)

    def _head_stays_blocked(self) -> bool:
        """Whether the next step, if pure decode, finds the queue's head blocked for a lasting reason,
        as `schedule` would conclude (then `_admission_blocked` is set): worked out without the
        step, so that a finish that frees too little for the head does not cost a full `schedule`.
        Only where that is exact: a static, non-preemptive order, and this step's decode members'
        new blocks off the plain free stack (no eviction to change the head's prefix hits)."""
        policy, dec, kv, cfg = self.policy, self.decode, self.kv, self.config
        budget = cfg.max_num_batched_tokens - len(dec.members)
        crossing = len(dec.crossers())
        if not policy.static_order or policy.preemptive or budget <= 0 or crossing > kv.pool.num_plain_free_blocks:
            return False
        head = self._next_queued()
        if head is None:
            return False
        if len(dec.members) + self._seqs_of(head) <= cfg.max_num_seqs:  # else short of sequences
            free = kv.pool.num_free_blocks - crossing - self._watermark_blocks
            if head.status == SWAPPED:
                need = kv.num_swapped_blocks(head)
            elif -(-(head.num_computed_base + head.num_prompt_tokens + head.num_output_base)
                   // self.block_size) + 1 <= free - self._queue_reserve:
                # It fits even if it needed a fresh block for every token and a copy-on-write one
                # (the most `free_blocks_needed` can say), and left the whole queue reserve free:
                # no need to plan it (most calls end here).
                # (Its num_computed_tokens + num_tokens, from its own counts: a queued request.)
                return False
            else:
                hits, num_hit = kv.get_computed_blocks(head)
                n_new = head.num_prompt_tokens + head.num_output_base - num_hit  # its num_tokens, as above
                n = min(n_new, budget, self._prefill_cap)
                if n < n_new and not cfg.enable_chunked_prefill:
                    return False  # short of budget: that may clear at the next step
                need = kv.free_blocks_needed(head, n, hits)
                if self._queue_reserve:
                    free -= self._held_for_queue(hits)
            if need <= free:
                return False  # it fits: the next step admits it
        self._admission_blocked = True
        return True

    def arrivals_change_nothing(self) -> bool:
        """True when the queue's head is blocked for a lasting reason (`_admission_blocked`: it stays
        blocked until a finish) and the order puts every later arrival behind it; never over a
        queue-aware pool, where an arrival's prompt changes which blocks the decode steps evict."""
        return self._admission_blocked and self.policy.arrivals_rank_last and not self.waiting.tells_kv

    def uniform_step_shape(self) -> tuple[int, int]:
        return len(self.decode.members), self.decode.context_sum

    def block_needs(self, k: int) -> list[int]:
        return self.decode.block_needs(k)

    def advance_decode_steps(self, k: int, now: float) -> list[Request]:
        """Take k uniform decode steps at once (k <= max_uniform_decode_steps()), with synthetic
        tokens. Identical to k rounds of schedule/update: the same blocks are appended in the
        same order; only the per-step bookkeeping is done once. `now` is the end of the last step."""
        dec = self.decode
        if dec.steps_to_next_finish() < k:
            raise ValueError(f"advance_decode_steps({k}): a request finishes before the last step")
        kv, buckets, bs, clock = self.kv, dec.buckets, self.block_size, dec.clock
        n = len(dec.members)
        if not kv.append_blocks([buckets[(clock + j) % bs] for j in range(k)]):
            for j in range(k):  # one by one: evictions, or a pool that runs out (k was too many)
                for req in buckets[(clock + j) % bs]:
                    if not kv.append_block(req):
                        raise ValueError(f"advance_decode_steps({k}): the pool ran out of blocks at step {j}")
        finished = dec.advance(k)
        for req in finished:
            self._finish(req, FINISHED_LENGTH, now)
        self._count_step(n, n, k)
        return finished

    # -- figures ------------------------------------------------------------------------------
    def _num_computed_running(self) -> int:
        return self.decode.context_sum - len(self.decode.members) + sum(r.num_computed_base for r in self.prefilling)

    def _queue_depth(self) -> tuple[int, int]:
        return len(self.waiting), len(self.swapped)
