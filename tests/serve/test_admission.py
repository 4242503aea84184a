"""`--max-waiting` counts the sequences a request queues (prompts x n), not the request: one
completion of many prompts, or of n samples, took the queue past its limit. The engine's steps are
held back behind a gate, so the queue is exactly what the test sent."""
import asyncio
import threading

import httpx

from paged.engine import AsyncLLM
from paged.serve.app import ServeSettings, build_app

from .conftest import ENGINE


def test_a_request_is_counted_as_prompts_times_n(tiny_chat_model):
    engine = AsyncLLM(str(tiny_chat_model), **ENGINE)
    app = build_app(engine, ServeSettings(served_model_names=["tiny"], max_waiting=3))
    gate, real_step = threading.Event(), engine.engine.step

    def step():
        assert gate.wait(60), "the test never opened the gate"
        return real_step()

    engine.engine.step = step

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test",
                                     timeout=30) as client:
            def complete(prompt, n=1):
                return client.post("/v1/completions", json={"prompt": prompt, "n": n, "max_tokens": 2,
                                                            "ignore_eos": True})

            async def queued(seqs: int):
                for _ in range(500):
                    if engine.num_waiting_seqs == seqs:
                        return
                    await asyncio.sleep(0.01)
                raise AssertionError(f"{engine.num_waiting_seqs} sequences wait, never {seqs}")

            first = asyncio.create_task(complete("a", n=2))
            await queued(2)
            refused = {"prompts": await complete(["b", "c"]), "n": await complete("b", n=2)}
            third = asyncio.create_task(complete("d"))  # 2 + 1 = 3: fits exactly
            await queued(3)
            refused["full"] = await complete("e")
            alone = {"prompts": await complete(["f"] * 4), "n": await complete("f", n=4),
                     "chat": await client.post("/v1/chat/completions", json={
                         "messages": [{"role": "user", "content": "f"}], "n": 4, "max_tokens": 2})}
            gate.set()
            served = [await first, await third]
        await engine.shutdown()
        return refused, alone, served

    refused, alone, served = asyncio.run(main())
    for r in refused.values():
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert "2 sequences are waiting and this request adds 2 (--max-waiting 3)" in refused["prompts"].json()["error"][
        "message"]
    assert "3 sequences are waiting and this request adds 1" in refused["full"].json()["error"]["message"]
    for kind, r in alone.items():
        assert r.status_code == 400, (kind, r.text)
        error = r.json()["error"]
        assert "queues 4 sequences" in error["message"] and "--max-waiting 3" in error["message"], error
        assert error["param"] == ("prompt" if kind == "prompts" else "n")
    assert "(4 prompts x n=1)" in alone["prompts"].json()["error"]["message"]
    assert "(1 prompt x n=4)" in alone["n"].json()["error"]["message"]
    assert [r.status_code for r in served] == [200, 200] and len(served[0].json()["choices"]) == 2
    assert not engine.engine.requests
