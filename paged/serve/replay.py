"""Open-loop replay: each request sent at its arrival time, whatever the server does, streamed
through `/v1/completions`, and timed as its tokens come back.

Arrival times are kept by one asyncio loop that sleeps until each request's time and starts it
as a task of its own, so a slow answer never delays the next send; a request's body is built
before the sleep that precedes it. How late each send was against its schedule is recorded
(`sent_s - scheduled_s`): a replay that falls behind says so rather than silently lowering the
load. Every request ends finished or as an error (an HTTP status other than 200, a transport
failure, an error event, a stream cut before `data: [DONE]`); none is dropped.
"""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
from httpx_sse import EventSource

from paged.workloads.workload import Workload

BACKEND_HEADER = "x-paged-backend"  # a router's name for the backend that answered (`paged.serve.router`)

PENDING, FINISHED, ERROR = 0, 1, 2
LEAD_S = 0.05  # the first send is this far after the replay starts, so it is not late by the setup
# What every request samples with unless asked otherwise: greedy, as `vllm bench serve` sends by default (an
# OpenAI server samples at temperature 1 when a request names none, which costs the engine more per token and
# is not what a step profile, greedy, timed).
GREEDY = {"temperature": 0.0}


class Records:
    """One row per request, times in seconds from the replay's start; `itl_s[i]` holds the gaps
    between request i's streamed chunks (a chunk is a token from vLLM and this project's server).
    `cached_tokens[i]`: the prompt tokens the server found in its prefix cache, as its usage reports
    them (`prompt_tokens_details.cached_tokens`; -1 when it does not); `backend[i]`: the backend a
    router sent the request to (its `x-paged-backend` header; "" without a router)."""

    def __init__(self, n: int) -> None:
        self.scheduled_s, self.sent_s, self.first_token_s, self.finished_s = (np.full(n, np.nan) for _ in range(4))
        self.num_generated = np.zeros(n, dtype=np.int64)
        self.cached_tokens = np.full(n, -1, dtype=np.int64)
        self.backend = [""] * n
        self.status = np.full(n, PENDING, dtype=np.int8)
        self.itl_s = [np.zeros(0)] * n
        self.error = [""] * n


class _Failed(Exception):
    """A request that ends as an error, with what went wrong."""


async def _one(client: httpx.AsyncClient, url: str, body: bytes, i: int, rec: Records, clock, t0: float) -> None:
    rec.sent_s[i] = clock() - t0
    times, generated, done = [], None, False
    try:
        async with client.stream("POST", f"{url}/v1/completions", content=body,
                                 headers={"content-type": "application/json"}) as r:
            rec.backend[i] = r.headers.get(BACKEND_HEADER, "")
            if r.status_code != 200:
                raise _Failed(f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}")
            async for event in EventSource(r).aiter_sse():
                if event.data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(event.data)
                if "error" in chunk:
                    raise _Failed(f"error event: {json.dumps(chunk['error'])[:200]}")
                if any(c.get("text") for c in chunk.get("choices") or ()):
                    times.append(clock() - t0)
                if usage := chunk.get("usage"):
                    generated = usage.get("completion_tokens")
                    rec.cached_tokens[i] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", -1)
        if not done:
            raise _Failed("the stream ended before data: [DONE]")
    except Exception as e:  # whatever went wrong, the request is counted as an error
        rec.status[i], rec.error[i] = ERROR, str(e) if isinstance(e, _Failed) else f"{type(e).__name__}: {e}"
        rec.finished_s[i] = clock() - t0
        return
    rec.finished_s[i] = clock() - t0
    rec.status[i] = FINISHED
    rec.num_generated[i] = generated if generated is not None else len(times)
    if times:
        rec.first_token_s[i] = times[0]
        rec.itl_s[i] = np.diff(times)


def request_body(model: str, prompt, max_tokens: int, sampling: dict) -> bytes:
    """A streamed completion of exactly `max_tokens` tokens (ignore_eos), with the usage at the end (its
    cached tokens) and the `sampling` fields."""
    return json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, **sampling,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()


async def replay(url: str, model: str, workload: Workload, prompt, timeout_s: float = 600.0, on_done=None,
                 indices=None, start_wall_s: float | None = None,
                 sampling: dict | None = None) -> tuple[Records, float]:
    """Replay `workload` against `url` (prompts from `prompt(i)`, outputs of the trace's lengths
    via max_tokens and ignore_eos); returns the records and the replay's length in seconds (from
    its start to the last answer). `on_done()` is called as each request ends (a progress bar's update).
    Only the requests `indices` (default: all) are sent, from `start_wall_s` (a `time.time()`;
    default: now), so that processes can share one replay (`paged.serve.replay_workers`).
    `sampling`: the sampling fields every request carries (default `GREEDY`)."""
    sampling = GREEDY if sampling is None else sampling
    loop = asyncio.get_running_loop()
    rec = Records(len(workload))
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as client:
        t0 = loop.time() + (LEAD_S if start_wall_s is None else start_wall_s - time.time())
        tasks = []
        for i in range(len(workload)) if indices is None else indices:
            body = request_body(model, prompt(i), int(workload.num_output_tokens[i]), sampling)
            rec.scheduled_s[i] = float(workload.arrival_s[i])
            delay = t0 + rec.scheduled_s[i] - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(_one(client, url, body, i, rec, loop.time, t0))
            if on_done is not None:
                task.add_done_callback(lambda _: on_done())
            tasks.append(task)
        await asyncio.gather(*tasks)
        end = loop.time()
    return rec, end - t0
