"""AsyncLLM: an asyncio engine that streams tokens as they are produced and takes requests while running.

One background task owns the `LLMEngine`. Each step runs in a worker thread (torch releases
the GIL), so the event loop keeps accepting requests meanwhile; new requests and aborts are
queued and applied between steps, because the scheduler must not change under a running step.
A request that cannot run fails its own stream with the engine's ValueError; the others go on.

    engine = AsyncLLM(model="smollm2-135m")
    async for out in engine.generate("Hello", SamplingParams(max_tokens=32)):
        print(out.text)          # cumulative text so far; out.finished on the last one
"""
from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from paged import SamplingParams

from .engine import LLMEngine, Prompt
from .engine_config import EngineConfig
from .request_output import RequestOutput

T = TypeVar("T")


class AsyncLLM:
    def __init__(self, model: str, **kwargs) -> None:
        """`kwargs` are the fields of `EngineConfig`."""
        self.engine = LLMEngine(EngineConfig(model=str(model), **kwargs))
        self._streams: dict[str, asyncio.Queue] = {}
        self._to_add: list[tuple[str, Prompt, SamplingParams | None, asyncio.Queue]] = []
        self._to_abort: list[str] = []
        self._to_inspect: list[tuple[Callable[[LLMEngine], Any], asyncio.Future]] = []
        self._wakeup: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self._ids = itertools.count()
        self._waiting_seqs = 0  # the scheduler's, counted before the last step (`num_waiting_seqs`)

    async def generate(self, prompt: Prompt, sampling_params: SamplingParams | None = None,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Cumulative outputs of one request, one per step that moved it; the last has `finished`."""
        if request_id is None:
            while (request_id := f"async-{next(self._ids)}") in self._streams:
                pass  # a user's request took this name
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already streaming")
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = queue
        self._to_add.append((request_id, prompt, sampling_params, queue))
        self._start()
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._streams.pop(request_id, None)
            if not finished:  # the consumer left early, or its request failed: free its blocks
                self._to_abort.append(request_id)
                self._wakeup.set()

    async def abort(self, request_id: str) -> None:
        """Stop a request; its stream ends with a last output whose finish_reason is "abort"."""
        self._to_abort.append(request_id)
        self._start()

    async def inspect(self, fn: Callable[[LLMEngine], T]) -> T:
        """`fn(engine)`, run between steps (never while one runs in its worker thread), so that it
        reads the scheduler and the block pool in a consistent state; its result or exception."""
        future = asyncio.get_running_loop().create_future()
        self._to_inspect.append((fn, future))
        self._start()
        return await future

    @property
    def num_waiting_seqs(self) -> int:
        """Sequences queued for admission, those of requests not yet handed to the engine included;
        a request of n samples not yet forked counts n. The scheduler's queue is counted between
        steps (a step admits and preempts in its worker thread): while one runs, what it admits
        still counts, so a limit on this errs on the side of refusing."""
        return self._waiting_seqs + sum(1 if params is None else params.n for _, _, params, _ in self._to_add)

    def _start(self) -> None:
        """Wake the engine loop, starting it in the running event loop if it is not running there."""
        loop = asyncio.get_running_loop()
        if self._loop_task is None or self._loop_task.done() or self._loop_task.get_loop() is not loop:
            self._wakeup = asyncio.Event()
            self._loop_task = loop.create_task(self._run())
        self._wakeup.set()

    async def _run(self) -> None:
        engine = self.engine
        while True:
            self._apply_pending()
            if not engine.has_unfinished_requests():
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                outputs = await asyncio.to_thread(engine.step)
            except Exception as e:  # an engine bug: fail every stream rather than hang them
                for request_id, queue in list(self._streams.items()):
                    engine.abort_request(request_id)
                    queue.put_nowait(e)
                continue
            for out in outputs:
                queue = self._streams.get(out.request_id)
                if queue is not None:
                    queue.put_nowait(out)

    def _apply_pending(self) -> None:
        """Between steps: queue the new requests, then the aborts (which may name one just added),
        then the inspections (which see both); last, the waiting sequences are counted."""
        engine = self.engine
        while self._to_add:
            request_id, prompt, params, queue = self._to_add.pop(0)
            try:
                engine.add_request(prompt, params, request_id=request_id)
            except Exception as e:  # noqa: BLE001 -- whatever a bad request raises ends its stream only
                queue.put_nowait(e if isinstance(e, ValueError) else ValueError(f"request {request_id!r}: {e!r}"))
        while self._to_abort:
            request_id = self._to_abort.pop()
            out = engine.abort_request(request_id)
            queue = self._streams.get(request_id)
            if out is not None and queue is not None:
                queue.put_nowait(out)
        while self._to_inspect:
            fn, future = self._to_inspect.pop(0)
            if future.cancelled():
                continue
            try:
                future.set_result(fn(engine))
            except Exception as e:  # noqa: BLE001 -- the caller's problem, raised where it awaits
                future.set_exception(e)
        self._waiting_seqs = engine.scheduler.num_waiting_seqs()

    async def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
            self._loop_task = None
