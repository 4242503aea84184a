"""Several engine streams read as one: (prompt index, output) in the order outputs arrive.

Leaving early (a client gone, an error) cancels every stream still running, which aborts its
engine request and frees its blocks (AsyncLLM.generate's own cleanup).
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from paged.engine import RequestOutput

_END = object()


async def merge(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    if len(streams) == 1:  # the common case, without a task and a queue per output
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in stream:
                queue.put_nowait((i, out))
            queue.put_nowait((i, _END))
        except Exception as e:  # noqa: BLE001 -- handed to the reader, which raises it
            queue.put_nowait((i, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            i, item = await queue.get()
            if item is _END:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
