"""A request handler's work, cancelled as soon as its client disconnects.

Starlette notices a client that leaves a streamed answer (the next write fails, and the stream's
generator is closed), but a handler that computes a whole answer before sending anything never
writes until it is done: left alone, a non-streaming request whose client gave up runs to its
last token and holds its blocks all along. So, as vLLM's `with_cancellation` does, the work
races the ASGI `http.disconnect` message; when the client wins, the work is cancelled, which
unwinds `AsyncLLM.generate`, whose cleanup aborts the engine request and frees its blocks.

The watch starts only once the body is read: until then the handler itself is reading `receive`.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from fastapi import Request
from fastapi.responses import Response

CLIENT_CLOSED = 499  # nginx's "client closed request": no one reads it, but an access log shows it


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(request: Request, work: Awaitable[Response]) -> Response:
    """`work`'s response (or its exception); if the client disconnects first, `work` is cancelled
    and waited for (its cleanup has run when this returns), and the answer is an empty 499."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return Response(status_code=CLIENT_CLOSED)
    finally:
        for t in (task, watch):
            t.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
