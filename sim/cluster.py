"""Replicas behind a router, fed by one arrival process.

The arrival process walks the workload's columns and creates each `paged.Request` only when
it arrives; its timeouts are URGENT (see `sim.clock`), so that at equal times every replica
sees the arrival. A request reaches the router and a replica `frontend_latency_s` after its
arrival (`SimConfig.frontend_latency_s`: the HTTP front end's share): its `arrival_time` is then,
as an engine's is, and its latencies count from the client's arrival (`RequestLog`). Replicas
behind a router cut their fast-path windows at the next arrival anywhere, which keeps the state a
router reads at an arrival identical with and without the fast path.

A lone replica that nothing watches at arrivals (no router, no SLO watch, no KV-event reads) takes
its arrivals itself instead (`pull_arrivals`): before each step ends it is handed those due by then,
in order, as their events would have handed them (an arrival at a step's end comes first, see
`sim.clock`); only while it is idle is the next arrival an event. Each replica and scheduler call
comes in the same order with the same arguments, so the run is the same, with an event per idle
spell instead of one per arrival and one per step that an arrival interrupts.
"""
from __future__ import annotations

import numpy as np
import simpy

from paged.core.hashing import extend_block_hashes
from paged.core.request import Request, SamplingParams
from paged.core.scheduler_base import BaseScheduler
from paged.workloads.workload import Workload

from .clock import MAX_TRACE_SPAN_S, TICKS_PER_S, UrgentTimeout
from .cost_model import CostModel
from .kv_event_poll import PolledKVEvents
from .recorder import RequestLog, TimeSeries
from .replica import Replica


class Cluster:
    # Whether a lone unwatched replica pulls its arrivals (see the module's docstring); a test
    # turns it off to check the run is the same.
    pull_arrivals = True

    def __init__(self, env: simpy.Environment, workload: Workload, schedulers: list[BaseScheduler], cost: CostModel,
                 router, log: RequestLog, sample_interval_ticks: int, max_samples: int, fast_path: bool = True,
                 progress=None, frontend_latency_ticks: int = 0, kv_events_interval_ticks: int = 0) -> None:
        self.env = env
        self.workload = workload
        self.router = router
        self._routes_hashes = hasattr(router, "route_hashes")
        self.progress = progress  # a tqdm bar, or None
        self._progress_every = max(1, len(workload) // 200)  # arrivals per update of the bar
        last = float(workload.arrival_s[-1]) if len(workload) else 0.0
        if not last < MAX_TRACE_SPAN_S:
            raise ValueError(f"workload {workload.name!r} has arrivals until {last:.4g} s: the simulator's clock "
                             f"holds at most {MAX_TRACE_SPAN_S:.4g} s (are the timestamps in the unit the format "
                             "expects?)")
        # When each request reaches the router and the replicas, and its lengths: Python lists, read
        # once per request (a numpy element read costs a call and a conversion).
        self.arrival_ticks = (np.round(workload.arrival_s * TICKS_PER_S).astype(np.int64)
                              + frontend_latency_ticks).tolist()
        self._prompt_tokens = workload.num_prompt_tokens.astype(np.int64).tolist()
        self._output_tokens = workload.num_output_tokens.astype(np.int64).tolist()
        self.num_requests = len(workload)
        self.next_index = 0
        self._params: dict[int, SamplingParams] = {}
        self._has_extra = any(c is not None for c in (workload.priority, workload.business_value, workload.deadline_s))
        # Windows may run through arrivals that cannot change them, unless a router reads the
        # replicas' state at arrivals, or an SLO watch may stop the run at one.
        watched = len(schedulers) > 1 or log.watch is not None
        subscribe = getattr(router, "replica_events", None)  # a router that reads the replicas' KV events
        poll_ticks = kv_events_interval_ticks if subscribe is not None else 0
        self.replicas = [Replica(i, env, s, cost, log, TimeSeries(sample_interval_ticks, max_samples),
                                 self.next_arrival, fast_path, watched, poll_ticks) for i, s in enumerate(schedulers)]
        self._polled: list[PolledKVEvents] = []  # when it reads them every so often: delivered before routing
        if subscribe is not None:
            for r in self.replicas:
                view = subscribe(r.index)
                if poll_ticks:
                    view = PolledKVEvents(view, poll_ticks, lambda: env.now)
                    self._polled.append(view)
                r.pool.events = view
        if self.pull_arrivals and not watched and not self._polled:
            lone = self.replicas[0]
            lone.pull, lone.on_idle = self._arrive_due, self._await_arrival
            self._awaiting = False  # an arrival event is queued for the idle replica
            self._await_arrival()
        else:
            env.process(self._arrivals())

    def next_arrival(self) -> int | None:
        i = self.next_index
        return self.arrival_ticks[i] if i < self.num_requests else None

    def _arrivals(self):
        env = self.env
        for i, t in enumerate(self.arrival_ticks):
            now = env.now
            if t > now:
                yield UrgentTimeout(env, t - now)
            self._arrive(i, t)

    def _arrive(self, i: int, t: int) -> None:
        self.next_index = i + 1
        self._deliver(i, t)
        if self.progress is not None and (i + 1) % self._progress_every == 0:
            self.progress.update(self._progress_every)

    def _arrive_due(self, now: int) -> None:
        """Pulled by a lone replica: every arrival due by `now` not yet delivered, in order."""
        ticks, n = self.arrival_ticks, self.num_requests
        i = self.next_index
        while i < n and ticks[i] <= now:
            self._arrive(i, ticks[i])
            i += 1

    def _await_arrival(self) -> None:
        """The lone replica went idle: an event at the next arrival (URGENT, as in `_arrivals`)
        delivers what is due then, unless one is queued already (a timer woke the replica since)."""
        if self._awaiting or self.next_index >= self.num_requests:
            return
        self._awaiting = True
        ev = UrgentTimeout(self.env, self.arrival_ticks[self.next_index] - self.env.now)
        ev.callbacks.append(self._arrived)

    def _arrived(self, _ev) -> None:
        self._awaiting = False
        self._arrive_due(self.env.now)
        if self.replicas[0].idle:  # every arrival rejected: wait for the next
            self._await_arrival()

    @staticmethod
    def _prompt_ids(req: Request) -> list[int] | None:
        """The ids a router may read: a real router sees the prompt, never the answer to come, nor
        what a client cut off it (`Workload.cap_lengths` keeps the ids of the whole prompt)."""
        ids = req.prefix_hash_ids
        if ids is None:
            return None
        return ids[:-(-req.num_prompt_tokens // req.hash_id_block_size)]

    def _route(self, req: Request) -> int:
        """kv_aware gets the hashes of the prompt's full blocks, as the real router computes them from
        the tokens and as the replica will register them (the same list: the replica reuses it), so it
        claims nothing the replica will not store. From ids alone it would claim the whole of the last
        id's chunk, past the prompt's end, and those blocks would stay in flight until they expired."""
        router = self.router
        if self._routes_hashes and req.prefix_hash_ids is not None:
            block_size = router.block_size
            return router.route_hashes(extend_block_hashes(req, block_size, req.num_prompt_tokens // block_size),
                                       self.replicas)
        return router.route(self._prompt_ids(req), self.replicas)

    def _deliver(self, i: int, t: int) -> None:
        w = self.workload
        extra = {}
        if self._has_extra:
            if w.priority is not None:
                extra["priority"] = int(w.priority[i])
            if w.business_value is not None:
                extra["business_value"] = float(w.business_value[i])
            if w.deadline_s is not None:
                extra["deadline"] = float(w.deadline_s[i])
        max_tokens = self._output_tokens[i]
        params = self._params.get(max_tokens)
        if params is None:  # shared by all requests of this length: the scheduler only reads them
            params = self._params[max_tokens] = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        req = Request(str(i), num_prompt_tokens=self._prompt_tokens[i], sampling_params=params,
                      arrival_time=t / TICKS_PER_S,
                      prefix_hash_ids=w.prefix_ids(i) if w.prefix_index is not None else None,
                      hash_id_block_size=w.hash_id_block_size, hash_ids_cover_output=w.ids_cover_output, **extra)
        replicas = self.replicas
        for view in self._polled:
            view.deliver(t)
        r = replicas[0] if len(replicas) == 1 else replicas[self._route(req)]
        r.add(req, t)
