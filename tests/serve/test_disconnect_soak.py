"""Clients that leave (mid-stream, or while a whole answer is computed) abort their requests and
free their blocks (read back from /debug/kv), through the router too, and a few thousand mixed
requests leave every block free or cached with a clean audit."""
import asyncio
import random

import httpx
import pytest

from .conftest import start_router, wait_router, wait_until


def aborted(server) -> float:
    for line in server.get("/metrics").text.splitlines():
        if line.startswith("paged:aborted_requests_total{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no paged:aborted_requests_total")


def idle_and_clean(server) -> dict:
    kv = server.get("/debug/kv").json()
    return kv if not kv["requests"] and kv["pool"]["used"] == 0 else None


async def leave_after(client: httpx.AsyncClient, path: str, body: dict, chunks: int) -> None:
    """Stream, read `chunks` events, and close the connection."""
    async with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        lines = response.aiter_lines()
        for _ in range(chunks):
            await anext(lines)


LONG = {"prompt": "no one waits", "max_tokens": 480, "ignore_eos": True}


async def leave_once_running(server, url: str, body: dict, copies: int = 1) -> None:
    """Post `copies` of `body` and leave (each request cancelled, its connection closed) as soon as
    the replica runs them all: before their answers however fast the machine (a read timeout of
    0.5 s was not: 480 tokens of the tiny model took 0.45 s here)."""
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=copies)) as client:
        posts = [asyncio.create_task(client.post(url, json=body)) for _ in range(copies)]
        while len((await asyncio.to_thread(server.get, "/debug/kv")).json()["requests"]) < copies:
            assert not any(p.done() for p in posts), "an answer came before the replica was seen running them all"
            await asyncio.sleep(0.005)
        for post in posts:
            post.cancel()
        await asyncio.gather(*posts, return_exceptions=True)
        assert all(p.cancelled() for p in posts), "an answer came before its client left"


def test_a_client_leaving_mid_stream_aborts_and_frees_its_blocks(server):
    before = aborted(server)

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            long = {"prompt": "leave early", "max_tokens": 480, "ignore_eos": True}
            # Several at once, so the batch is slower than a client's goodbye.
            await asyncio.gather(*(leave_after(client, "/v1/completions", long, 3) for _ in range(4)))

    asyncio.run(main())
    wait_until(lambda: aborted(server) > before, "an abort after the clients left")
    kv = wait_until(lambda: idle_and_clean(server), "every block free after the aborts")
    assert kv["audit"]["ok"], kv["audit"]


def test_a_client_leaving_a_non_streamed_request_aborts_and_frees_its_blocks(server):
    """A non-streamed answer is written only when it is complete: the server must notice the
    client leave on its own (nothing to write yet fails) and abort, not run 480 tokens for no one."""
    before = aborted(server)

    asyncio.run(leave_once_running(server, f"{server.url}/v1/completions", LONG, copies=4))
    wait_until(lambda: aborted(server) >= before + 4, "the four requests aborted after their clients left")
    kv = wait_until(lambda: idle_and_clean(server), "every block free after the aborts")
    assert kv["audit"]["ok"], kv["audit"]


SOAK_REQUESTS = 2000  # the "a few thousand": a server lives for months


def test_soak_of_mixed_requests_leaves_no_block_behind(server, model_name):
    rng = random.Random(0)
    bodies = []
    for i in range(SOAK_REQUESTS):
        chat = rng.random() < 0.4
        body = {"messages": [{"role": "user", "content": f"question {i}"}]} if chat else \
            {"prompt": rng.choice([f"prompt {i}", [rng.randrange(256) for _ in range(rng.randrange(1, 60))],
                                   ["a", "shared prefix " * 4 + str(i)]])}
        body.update(max_tokens=rng.randrange(1, 40), temperature=rng.choice([0.0, 1.0]), n=rng.choice([1, 1, 2]),
                    seed=rng.randrange(100), stop=rng.choice([None, ["a"], "xy"]), ignore_eos=rng.random() < 0.5)
        kind = rng.choices(["plain", "stream", "leave", "bad"], [4, 3, 2, 1])[0]
        if kind == "bad":
            body["top_p"] = 7
        bodies.append(("/v1/chat/completions" if chat else "/v1/completions", body, kind))

    async def one(client, semaphore, path, body, kind):
        async with semaphore:
            if kind == "leave":
                await leave_after(client, path, body, 1)
                return 200
            if kind == "stream":
                async with client.stream("POST", path, json={**body, "stream": True}) as response:
                    lines = [line async for line in response.aiter_lines() if line]
                    assert lines[-1] == "data: [DONE]"
                    return response.status_code
            return (await client.post(path, json=body)).status_code

    async def main():
        semaphore = asyncio.Semaphore(24)
        async with httpx.AsyncClient(base_url=server.url, timeout=120,
                                     limits=httpx.Limits(max_connections=32)) as client:
            return await asyncio.gather(*(one(client, semaphore, *b) for b in bodies))

    statuses = asyncio.run(main())
    assert [s for s, (_, _, kind) in zip(statuses, bodies) if kind == "bad"] == [400] * sum(
        kind == "bad" for _, _, kind in bodies)
    assert all(s == 200 for s, (_, _, kind) in zip(statuses, bodies) if kind != "bad")
    kv = wait_until(lambda: idle_and_clean(server), "every block free or cached after the soak")
    assert kv["audit"]["ok"], kv["audit"]
    assert kv["pool"]["free"] == kv["pool"]["num_blocks"] and kv["pool"]["cached"] > 0
    assert server.get("/health").status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_leaving_through_the_router_aborts_at_the_replica(server, procs, stream):
    """The router must pass a client's goodbye on: a non-streamed answer is read whole by the
    router before it writes anything, so, left alone, it waited for all 480 tokens (the replica
    computing them for no one) instead of closing its upstream request, which the replica aborts."""
    url, proc = start_router(procs, [server.url], "round_robin", "--health-interval-s", "0.2")
    wait_router(procs, url, proc, [server.url])
    before = aborted(server)
    if stream:
        with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True}, timeout=60) as r:
            lines = r.iter_lines()
            next(lines)
    else:
        asyncio.run(leave_once_running(server, f"{url}/v1/completions", LONG))
    wait_until(lambda: aborted(server) > before, "the replica aborted the request its client left")
    kv = wait_until(lambda: idle_and_clean(server), "every block free after the abort")
    assert kv["audit"]["ok"], kv["audit"]
