"""The OpenAI-compatible app over one `AsyncLLM`: routes, authentication, admission, streaming.

    POST /v1/completions, /v1/chat/completions   (stream: server-sent events ending in [DONE])
    GET  /v1/models, /health, /metrics, /debug/kv    (/v1/models and /health: HEAD too, for probes)
    GET  /debug/steps?since=SEQ                  (the engine's steps: shapes and forward times, `StepLog`)
    GET  /kv/events?since=SEQ, /kv/blocks        (the prefix cache's changes, for routers: `kv_events`)

With an API key, every route but /health and /metrics needs `Authorization: Bearer <key>`:
vLLM checks its key on /v1 and leaves /health and /metrics open for probes and scrapers, as
here; it publishes KV events on a ZMQ socket of its own, not over HTTP, so /kv/events and
/kv/blocks (which tell anyone who can guess a prompt whether it is cached, and when) and
/debug/kv (every request's block table) and /debug/steps are guarded here like /v1. The router reads the KV
endpoints with the key it is given (`paged router --api-key`; `paged launch` hands it the
replicas' key). Bodies
over `max_body_bytes` get 413; with `max_waiting`, a request whose sequences (prompts x n) would
take the queue past that many gets 503 with Retry-After instead of a place in an ever longer
queue (`admission`).
"""
from __future__ import annotations

import hmac
import json
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from fastapi.sse import EventSourceResponse, format_sse_event
from prometheus_client import CONTENT_TYPE_LATEST

from paged.engine import AsyncLLM
from paged.engine.step_log import StepLog

from .admission import admit
from .debug_kv import kv_report
from .disconnect import cancel_on_disconnect
from .errors import PROBED, APIError, error_body, install_error_handlers, log
from .kv_events import DEFAULT_CAPACITY, KVEventLog, snapshot
from .metrics import ServerMetrics, cache_config_info, scheduler_snapshot
from .protocol import GenerateRequest, chat_request, completion_request, fit_context, json_body
from .responses import ResponseBuilder
from .streams import merge


@dataclass(slots=True)
class ServeSettings:
    served_model_names: list[str]
    api_key: str | None = None
    max_waiting: int | None = None  # None: no limit
    max_body_bytes: int = 4 << 20
    chat_template: str | None = None  # None: the model's own
    retry_after_s: int = 1
    kv_events_capacity: int = DEFAULT_CAPACITY


def build_app(engine: AsyncLLM, settings: ServeSettings) -> FastAPI:
    names = settings.served_model_names
    llm_engine = engine.engine
    metrics = ServerMetrics(names[0], cache_config_info(llm_engine))
    max_model_len = llm_engine.scheduler.config.max_model_len
    kv_log = KVEventLog(settings.kv_events_capacity)
    llm_engine.scheduler.kv.pool.events = kv_log  # before any request: the log sees every change
    step_log = StepLog.install(llm_engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await engine.shutdown()

    app = FastAPI(title="paged", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app, metrics.error)

    key = settings.api_key.encode() if settings.api_key is not None else None

    def authorized(request: Request) -> None:
        if key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key):
            raise APIError(401, "missing or invalid API key (Authorization: Bearer <key>)")

    protected = [Depends(authorized)]

    @app.api_route("/health", methods=PROBED)
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(await engine.inspect(scheduler_snapshot)), media_type=CONTENT_TYPE_LATEST)

    @app.get("/debug/kv", dependencies=protected)
    async def debug_kv() -> JSONResponse:
        return JSONResponse(await engine.inspect(kv_report))

    @app.get("/debug/steps", dependencies=protected)
    async def debug_steps(since: int = Query(0, ge=0)) -> JSONResponse:
        return JSONResponse(await engine.inspect(lambda _: step_log.since(since)))

    @app.get("/kv/events", dependencies=protected)
    async def kv_events(since: int = 0) -> JSONResponse:
        return JSONResponse(await engine.inspect(lambda _: kv_log.since(since)))

    @app.get("/kv/blocks", dependencies=protected)
    async def kv_blocks() -> JSONResponse:
        return JSONResponse(await engine.inspect(lambda e: snapshot(kv_log, e)))

    @app.api_route("/v1/models", methods=PROBED, dependencies=protected)
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "paged", "root": llm_engine.model_name,
             "max_model_len": max_model_len} for name in names]})

    @app.post("/v1/completions", dependencies=protected)
    async def completions(request: Request) -> Response:
        req = completion_request(await json_body(request, settings.max_body_bytes), names)
        try:
            req.prompts = [llm_engine.tokens_prompt(p) for p in req.prompts]
        except ValueError as e:
            raise APIError.bad_request(e) from None
        builder = ResponseBuilder(False, f"cmpl-{uuid.uuid4().hex}", req.model, req.params.n, req.return_token_ids)
        return await cancel_on_disconnect(request, generate(req, builder, chat=False))

    @app.post("/v1/chat/completions", dependencies=protected)
    async def chat_completions(request: Request) -> Response:
        req, chat = chat_request(await json_body(request, settings.max_body_bytes), names, max_model_len)
        try:
            req.prompts = [llm_engine.chat_prompt(chat_template=settings.chat_template, **chat)]
        except ValueError as e:
            raise APIError(400, str(e), "messages") from None
        builder = ResponseBuilder(True, f"chatcmpl-{uuid.uuid4().hex}", req.model, req.params.n, req.return_token_ids)
        return await cancel_on_disconnect(request, generate(req, builder, chat=True))

    async def generate(req: GenerateRequest, builder: ResponseBuilder, chat: bool) -> Response:
        """`req.prompts` are TokensPrompts (their lengths known), each checked against the context."""
        params = []
        for i, prompt in enumerate(req.prompts):
            try:
                params.append(fit_context(req, len(prompt["prompt_token_ids"]), max_model_len, chat))
            except APIError as e:
                if len(req.prompts) > 1:
                    e.message = f"prompt {i}: {e.message}"
                raise
        admit(engine.num_waiting_seqs, len(req.prompts), req.params.n, settings.max_waiting, settings.retry_after_s)
        streams = [engine.generate(p, params[i], request_id=f"{builder.id}-{i}") for i, p in enumerate(req.prompts)]
        trackers = [metrics.tracker() for _ in streams]
        outputs = merge(streams)
        try:
            first = await anext(outputs)  # a bad prompt fails here, before any status is sent
        except ValueError as e:
            raise APIError.bad_request(e) from None
        last = [None] * len(streams)

        def take(i, out):
            trackers[i].observe(out)
            last[i] = out

        take(*first)
        if not req.stream:
            try:
                async for i, out in outputs:
                    take(i, out)
            except ValueError as e:
                raise APIError.bad_request(e) from None
            return JSONResponse(builder.response(last))

        async def events():
            chunk = builder.chunk(first[0], first[1], req.include_usage)
            if chunk:
                yield _event(chunk)
            try:
                async for i, out in outputs:
                    take(i, out)
                    if chunk := builder.chunk(i, out, req.include_usage):
                        yield _event(chunk)
            except ValueError as e:  # a later prompt of the request failed: say so in the stream
                error = APIError.bad_request(e)
                yield _event(error_body(error.status, error.message, error.param))
            except Exception as e:  # the engine failed (AsyncLLM fails every stream): the status is sent
                log.exception("a stream failed after it started")
                metrics.error(500)
                yield _event(error_body(500, f"internal error: {type(e).__name__}: {e}"))
            else:
                if req.include_usage:
                    yield _event(builder.usage_chunk(last))
            yield format_sse_event(data_str="[DONE]")

        return EventSourceResponse(events())

    return app


def _event(body: dict) -> bytes:
    return format_sse_event(data_str=json.dumps(body, ensure_ascii=False, separators=(",", ":")))
