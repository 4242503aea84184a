"""One replica: the shared `paged` Scheduler stepped by a simpy process, a cost model in
place of the GPU.

The process is tiny: wait until there is work, then repeatedly `begin` a step (the
scheduler decides, the cost model says how long) and `end` it (the scheduler learns what
happened) after that much simulated time. No scheduling decision is taken here. A step that
ends strictly before simpy's next queued event ends at once (`sim.clock.Environment.try_advance`),
without a Timeout: the same order, fewer events.

The fast path. After each step the scheduler says for how many next steps the decode batch
stays fixed (`max_uniform_decode_steps`: no admission possible, no finish before the last,
blocks enough). The replica then takes them as one event, cut short so that no request
arrives before any of them starts (an arrival would be admitted by a real `schedule()`;
an arrival at exactly a step boundary is seen by that step, see `sim.clock`), and so that
it ends by the next time-series sample (a sample then always sees the scheduler as it is).
A lone replica that nothing reads at arrivals skips the first cut when the scheduler says
arrivals cannot change the window (`arrivals_change_nothing`: they queue behind a blocked head).
Step times come from `sim.window` in closed form. The result is identical to stepping,
which the tests check on random workloads and configurations.
"""
from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate

import numpy as np

from paged.core.request import FINISHED_STOPPED
from paged.core.scheduler_base import BaseScheduler

from .clock import TICKS_PER_S, Environment, to_ticks
from .cost_model import CostModel
from .itl import LongestStepSince
from .itl_histogram import add_window_to_histogram, itl_bin
from .recorder import RequestLog, TimeSeries
from .window import envelope, first_reaching, span, step_duration, steps_within


class Replica:
    def __init__(self, index: int, env: Environment, scheduler: BaseScheduler, cost: CostModel,
                 log: RequestLog, timeseries: TimeSeries, next_arrival: Callable[[], int | None],
                 fast_path: bool = True, watched: bool = True, poll_ticks: int = 0) -> None:
        self.index = index
        self.env = env
        self.scheduler = scheduler
        self.cost = cost
        self.log = log
        self.timeseries = timeseries
        self.next_arrival = next_arrival  # tick of the next request to arrive anywhere, None after the last
        # Whether anything reads this replica's state at an arrival (a router choosing among
        # replicas, an SLO watch that may stop the run there): then windows stop at arrivals.
        self.watched = watched
        # A router reads this replica's KV events at every multiple of poll_ticks (sim.kv_event_poll),
        # seeing those from before the read: windows end before the next read, so that every event a
        # window emits at its end is seen at the read its step's own would be (0: no reads).
        self.poll_ticks = poll_ticks
        self.fast_path = fast_path
        # A lone replica that nothing watches takes its arrivals itself (`sim.cluster`): `pull(now)`
        # hands it those due by `now` before each step ends, `on_idle()` queues an event for the
        # next one when it goes idle. None: each arrival is an event of the cluster's.
        self.pull: Callable[[int], None] | None = None
        self.on_idle: Callable[[], None] | None = None
        self.pool = scheduler.kv.pool
        self.num_gpu_blocks = scheduler.cache_config.num_gpu_blocks  # its KV cache, which routers read
        self.block_size = scheduler.block_size
        self.idle = True
        self.outstanding = 0  # requests routed here and not finished yet
        self.peak_used_blocks = 0
        self.itl_hist: dict[int, int] = {}  # inter-token latency of decode tokens: log bin -> tokens
        self.itl_weighted_ticks = 0  # sum over decode tokens of their inter-token latency
        self.longest_step = LongestStepSince()  # for each request's longest inter-token latency
        self.longest_stall: dict[str, int] = {}  # request id -> its longest gap across a preemption
        self.num_windows = 0
        self.num_window_steps = 0
        self.busy_ticks = 0  # time spent running steps: the GPU's busy time
        self._wake = env.event()
        self._wake_generation = 0
        self._out = None  # the step in progress, when not a window
        self._step_ticks = 0
        self._window = None  # (steps, lines, batch size, tokens a step gives clients) of the window in progress
        self._k = 0  # uniform decode steps available now
        # With per-token ITLs asked for: each unfinished request's token times (ticks), and the
        # output counts of the running requests when the step in progress began.
        self.token_times: dict[str, list[int]] | None = {} if log.itl_s is not None else None
        self._counts_before: list | None = None
        env.process(self._run())

    # -- the simpy process --------------------------------------------------------------------
    def _run(self):
        env = self.env
        pull = self.pull
        while True:
            yield self._wake
            now = env.now
            if self.timeseries.next_tick < now:  # woken by a timer: the samples due show the idle state
                self._sample(now)
            delay = self._begin(now)
            while delay is not None:
                now += delay
                if not env.try_advance(now):  # something else happens before the step ends
                    yield env.timeout(delay)
                if pull is not None:  # the arrivals up to the step's end, as their events would have come
                    pull(now)
                self._end(now)
                delay = self._begin(now)

    # -- requests in --------------------------------------------------------------------------
    def add(self, req, now: int) -> None:
        if self.timeseries.next_tick < now:
            self._sample(now)
        self.scheduler.add_request(req)
        if req.status >= FINISHED_STOPPED:  # rejected: it can never run here (is_finished inlined: every arrival)
            self.log.record(req, self.index, None, req.num_output_tokens)
            return
        self.outstanding += 1
        if self.idle:
            self._wakeup()

    @property
    def used_blocks(self) -> int:
        """Device blocks in use now. Inside a window the scheduler still shows its start, and
        every step of the window has started (windows end at the next arrival): add its blocks."""
        used = self.pool.num_used_blocks
        return used + self._window_blocks(self._window[0]) if self._window is not None else used

    @property
    def kv_usage(self) -> float:
        """The share of device blocks in use (what a router reads; `routing.ReplicaView`)."""
        return self.used_blocks / self.pool.num_blocks

    def _window_blocks(self, n: int) -> int:
        """Blocks the next n uniform decode steps allocate (periodic: each member of the batch
        crosses into a new block once every block_size steps)."""
        bs = self.block_size
        needs = self.scheduler.block_needs(min(n, bs))
        return n // bs * sum(needs) + sum(needs[:n % bs]) if n >= bs else sum(needs)

    def _wakeup(self) -> None:
        self.idle = False
        self._wake_generation += 1
        ev, self._wake = self._wake, self.env.event()
        ev.succeed()

    def _go_idle(self, now: int, next_wakeup: float | None) -> None:
        self.idle = True
        if self.on_idle is not None:
            self.on_idle()
        if next_wakeup is not None:  # static batching: a partial batch launches at its timeout
            gen = self._wake_generation
            timer = self.env.timeout(max(1, to_ticks(next_wakeup) - now))
            timer.callbacks.append(lambda _ev: self._timer(gen))

    def _timer(self, generation: int) -> None:
        if self.idle and generation == self._wake_generation:  # not woken by an arrival since
            self._wakeup()

    # -- one step (or one window of uniform decode steps) -------------------------------------
    def _begin(self, now: int) -> int | None:
        """Start the next step at `now`; its duration in ticks, or None when there is nothing to run."""
        sched = self.scheduler
        k = self._k
        if k:
            self._k = 0
            batch, context_sum = sched.uniform_step_shape()
            lines = self.cost.decode_lines(batch, context_sum)
            segs = envelope(lines)
            # Every step must start before the next arrival, and the window must end by the next
            # sample, so that a sample never has to see the middle of a window.
            nxt = None if not self.watched and sched.arrivals_change_nothing() else self.next_arrival()
            n = k if nxt is None else first_reaching(segs, nxt - now, k)
            d = span(segs, n)
            budget = self.timeseries.next_tick - now
            if self.poll_ticks:
                budget = min(budget, (now // self.poll_ticks + 1) * self.poll_ticks - 1 - now)
            if d > budget:
                n = steps_within(segs, budget, n)
                d = span(segs, n)
            if n:
                used = self.pool.num_blocks - self.pool.num_free_blocks  # num_used_blocks inlined: every window
                if used + (n // self.block_size + 1) * batch > self.peak_used_blocks:  # a new peak is possible
                    used += self._window_blocks(n)
                    if used > self.peak_used_blocks:
                        self.peak_used_blocks = used
                tokens = sched.uniform_step_tokens_out()
                self._window = (n, lines, batch, tokens)
                self.num_windows += 1
                self.num_window_steps += n
                self.itl_weighted_ticks += d * tokens
                self.busy_ticks += d
                if self.token_times is not None:
                    self._count_outputs()
                return d
        out = sched.schedule(now / TICKS_PER_S)
        if self.token_times is not None:  # after schedule(): who runs, admitted ones included
            self._count_outputs()
        if not out.prefill_requests and out.is_empty and not out.preempted:  # (a list first: most full steps prefill)
            if sched.has_unfinished_requests() and out.next_wakeup is None:
                raise RuntimeError(f"replica {self.index}: the scheduler has unfinished requests but scheduled "
                                   f"nothing and set no wakeup at t={now / TICKS_PER_S:.6f} s: {sched.stats()}")
            self._go_idle(now, out.next_wakeup)
            return None
        # (A step that only preempted still takes the per-step overhead, then the scheduler retries.)
        self._out = out
        pool = self.pool
        used = pool.num_blocks - pool.num_free_blocks  # num_used_blocks inlined: read every step
        if used > self.peak_used_blocks:
            self.peak_used_blocks = used
        self._step_ticks = d = self.cost.step_ticks(out)
        self.busy_ticks += d
        return d

    def _end(self, now: int) -> None:
        if self.timeseries.next_tick < now:
            self._sample(now)
        sched = self.scheduler
        win = self._window
        if win is not None:
            self._window = None
            n, lines, _batch, tokens = win
            finished = sched.advance_decode_steps(n, now / TICKS_PER_S)
            if self.token_times is not None:
                durations = [step_duration(lines, j) for j in range(n)]
                self._record_token_times(list(accumulate(durations, initial=now - sum(durations)))[1:])
            longest = add_window_to_histogram(self.itl_hist, lines, n, tokens)  # (it returns the longest step)
            self.longest_step.add(now, longest)
        else:
            out, self._out = self._out, None
            # Tokens sampled outside the decode batch by requests that had tokens before (back
            # from a preemption, or the step after a fork): their gap includes any stall. (Had
            # tokens: has a first token time, a plain field; num_output_tokens is a property call
            # made from C, for each of the run's prefills.)
            for r, n in zip(out.prefill_requests, out.prefill_num_tokens):
                if r.first_token_time is not None and r.num_computed_tokens + n == r.num_tokens:
                    gap = now - to_ticks(r.last_token_time)
                    b = itl_bin(gap)
                    self.itl_hist[b] = self.itl_hist.get(b, 0) + 1
                    self.itl_weighted_ticks += gap
                    if gap > self.longest_stall.get(r.request_id, 0):
                        self.longest_stall[r.request_id] = gap
            finished = sched.update_from_output(out, None, now / TICKS_PER_S)
            if self.token_times is not None:
                self._record_token_times([now])
            self.longest_step.add(now, self._step_ticks)
            # tokens clients get: a static batch's padding slots give none (num_decode_requests inlined: every step)
            nd = len(out.decode_requests) or out.num_decode_tokens
            if nd:
                d = self._step_ticks
                b = itl_bin(d)
                self.itl_hist[b] = self.itl_hist.get(b, 0) + nd
                self.itl_weighted_ticks += d * nd
        if finished:
            record, index = self.log.record, self.index
            for req in finished:
                if self.token_times is not None:
                    times = self.token_times.pop(req.request_id, [])
                    self.log.itl_s[int(req.request_id)] = np.diff(np.array(times, dtype=np.int64)) / TICKS_PER_S
                stall = self.longest_stall.pop(req.request_id, 0)
                last = sched.last_token_time(req)
                gen = req.num_output_tokens
                if gen > 1:
                    since = self.longest_step.since(to_ticks(req.first_token_time))
                    record(req, index, last, gen, (since if since > stall else stall) / TICKS_PER_S)
                else:
                    record(req, index, last, gen)
            self.outstanding -= len(finished)
        if self.fast_path:
            self._k = sched.max_uniform_decode_steps()

    def _count_outputs(self) -> None:
        """Each running request's output count as the step (or window) begins."""
        self._counts_before = [(r, r.num_output_tokens) for r in self.scheduler.running_requests()]

    def _record_token_times(self, ends: list[int]) -> None:
        """A request that made m tokens in the steps ending at `ends` made them in the first m:
        a decoding request makes one a step until it stops (the scheduler says how many it made;
        which requests, and when they stop, stays the scheduler's business)."""
        times = self.token_times
        for req, before in self._counts_before:
            m = req.num_output_tokens - before
            if m:
                times.setdefault(req.request_id, []).extend(ends[:m])
        self._counts_before = None

    # -- time series --------------------------------------------------------------------------
    def _sample(self, now: int) -> None:
        """Record the samples due before `now`: the state has not changed since the last event,
        and no window spans a sample time, so the scheduler shows the state of the moment."""
        ts = self.timeseries
        st = self.scheduler.stats()
        out = self._out
        row = (st.kv_cache_usage_perc, st.kv_cache_tokens_perc, st.fragmentation, st.num_requests_running,
               st.num_requests_waiting, st.num_requests_swapped, out.num_scheduled_tokens if out is not None else 0)
        ts.fill(now, row)

    def close(self, end: int) -> None:
        """Record the samples due up to the end of the run, inclusive."""
        if self.timeseries.next_tick <= end:
            self._sample(end + 1)
