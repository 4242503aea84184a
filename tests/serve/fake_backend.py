"""A fake OpenAI-compatible server for the serve tests: no model, no torch.

    python -m tests.serve.fake_backend --port 8001 --name b0 --token-delay-s 0.01

It answers `/v1/completions` and `/v1/chat/completions` (streamed or not) with `max_tokens`
tokens ("t0 t1 ..."), one each `--token-delay-s`, and names itself in every answer's
`system_fingerprint`, so that a test sees which backend served a request through the router;
its usage reports half of each prompt's tokens cached (`prompt_tokens_details.cached_tokens`), as
its prefix-cache counters count them.
`/metrics` exports what a vLLM-compatible server would (`vllm:kv_cache_usage_perc`,
`vllm:num_requests_running`, the latency histograms and token and preemption counters that
`paged doctor` reads); `/debug/kv` in the real server's layout (`paged.serve.debug_kv`). A test sets the
reported KV usage with `POST /fake/kv_usage {"value": x}`. Options it does not know (an engine's,
passed through by `paged launch`) are ignored.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.sse import format_sse_event
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0)


def create_app(name: str, model: str, token_delay_s: float, kv_usage: float, leaks: int) -> FastAPI:
    app = FastAPI()
    r = CollectorRegistry()
    state = {"kv_usage": kv_usage}
    Gauge("vllm:kv_cache_usage_perc", "KV cache usage (0..1)", registry=r).set_function(lambda: state["kv_usage"])
    running = Gauge("vllm:num_requests_running", "Requests running", registry=r)
    e2e = Histogram("vllm:e2e_request_latency_seconds", "E2E latency", buckets=BUCKETS, registry=r)
    ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT", buckets=BUCKETS, registry=r)
    tokens = Counter("vllm:generation_tokens", "Generated tokens", registry=r)
    Counter("vllm:num_preemptions", "Preemptions", registry=r)
    finished = Counter("vllm:request_success", "Finished requests", registry=r)
    queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries (tokens)", registry=r)
    hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits (tokens)", registry=r)

    def chunk(kind: str, i: int, text: str | None, finish: str | None, usage_: dict | None = None) -> dict:
        if kind == "chat":
            choice = {"index": 0, "delta": {"content": text} if text is not None else {}, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish}
            obj = "text_completion"
        return {"id": f"{name}-{i}", "object": obj, "created": int(time.time()), "model": model,
                "system_fingerprint": name, "choices": [] if usage_ else [choice], "usage": usage_}

    async def complete(request: Request, kind: str):
        try:
            body = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"error": {"message": "bad JSON", "type": "invalid_request_error", "param": None,
                                           "code": None}}, status_code=400)
        n = int(body.get("max_tokens") or 16)
        prompt = body.get("prompt", body.get("messages", ""))
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        queries.inc(prompt_tokens)
        hits.inc(prompt_tokens // 2)
        usage_ = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n,
                  "prompt_tokens_details": {"cached_tokens": prompt_tokens // 2}}
        start = time.perf_counter()

        async def token(i: int) -> str:
            await asyncio.sleep(token_delay_s)
            if i == 0:
                ttft.observe(time.perf_counter() - start)
            tokens.inc()
            return f"t{i} "

        def done() -> None:
            e2e.observe(time.perf_counter() - start)
            finished.inc()

        if body.get("stream"):
            async def events():
                running.inc()
                try:
                    for i in range(n):
                        text = await token(i)
                        yield format_sse_event(data_str=json.dumps(chunk(kind, i, text, "length" if i == n - 1
                                                                                      else None)))
                    if (body.get("stream_options") or {}).get("include_usage"):
                        yield format_sse_event(data_str=json.dumps(chunk(kind, n, None, None, usage_)))
                    yield format_sse_event(data_str="[DONE]")
                    done()
                finally:
                    running.dec()

            return StreamingResponse(events(), media_type="text/event-stream")
        running.inc()
        try:
            text = "".join([await token(i) for i in range(n)])
        finally:
            running.dec()
        done()
        out = chunk(kind, 0, None, None)
        out["object"] = "chat.completion" if kind == "chat" else "text_completion"
        out["choices"] = [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                          if kind == "chat" else {"index": 0, "text": text, "finish_reason": "length"}]
        out["usage"] = usage_
        return JSONResponse(out)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, "text")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await complete(request, "chat")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model, "object": "model", "owned_by": name}]}

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(r), media_type=CONTENT_TYPE_LATEST)

    @app.get("/debug/kv")
    async def debug_kv():
        num_blocks = 1000
        used = int(round(state["kv_usage"] * num_blocks))
        # the layout of the real server's report (paged.serve.debug_kv.kv_report)
        leaked = list(range(leaks))
        return {"pool": {"num_blocks": num_blocks, "block_size": 16, "free": num_blocks - used, "cached": 0,
                         "used": used, "fragmentation": 0.02, "allocations": used, "frees": 0},
                "requests": [],
                "audit": {"ok": leaks == 0, "leaked_blocks": leaked,
                          "mismatched_ref_counts": [{"block": i, "ref_cnt": 1, "holders": 0} for i in leaked],
                          "orphan_tables": []}}

    @app.post("/fake/kv_usage")
    async def set_kv_usage(request: Request):
        state["kv_usage"] = float((await request.json())["value"])
        return {"ok": True}

    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--name", default=None, help="default: fake-PORT")
    p.add_argument("--model", default="fake-model")
    p.add_argument("--token-delay-s", type=float, default=0.0)
    p.add_argument("--kv-usage", type=float, default=0.0)
    p.add_argument("--leaks", type=int, default=0, help="blocks the /debug/kv audit reports leaked")
    args, _engine_options = p.parse_known_args(argv)
    app = create_app(args.name or f"fake-{args.port}", args.model, args.token_delay_s, args.kv_usage, args.leaks)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
