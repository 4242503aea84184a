"""An engine step that raises mid-stream ends the stream as OpenAI's and vLLM's servers end one
that fails after it started: an error event, then `data: [DONE]` (a client, or the router,
otherwise reads a cut chunked body); the server frees the request and serves the next one."""
import asyncio
import json

import httpx

from paged.engine import AsyncLLM
from paged.serve.app import ServeSettings, build_app

from .conftest import ENGINE


def test_an_engine_failure_mid_stream_ends_with_an_error_event_and_done(tiny_chat_model):
    engine = AsyncLLM(str(tiny_chat_model), **ENGINE)
    app = build_app(engine, ServeSettings(served_model_names=["tiny"]))
    real_step, steps = engine.engine.step, []

    def step():
        steps.append(1)
        if len(steps) == 4:
            raise RuntimeError("the device fell off the bus")
        return real_step()

    engine.engine.step = step
    body = {"prompt": "x", "max_tokens": 20, "ignore_eos": True, "stream": True}

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test",
                                     timeout=60) as client:
            streamed = await client.post("/v1/completions", json=body)
            after = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        await engine.shutdown()
        return streamed, after

    streamed, after = asyncio.run(main())
    data = [line.removeprefix("data: ") for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert streamed.status_code == 200 and data[-1] == "[DONE]", data[-2:]
    error = json.loads(data[-2])["error"]
    assert error["code"] == 500 and "the device fell off the bus" in error["message"]
    assert len(data) > 2 and all("choices" in json.loads(d) for d in data[:-2])  # tokens came before it
    assert after.status_code == 200 and not engine.engine.requests
