"""`paged router`: an OpenAI-compatible load balancer over OpenAI-compatible servers.

    paged router --backend http://10.0.0.1:8000 --backend http://10.0.0.2:8000 --policy prefix_aware

Each completion (`/v1/completions`, `/v1/chat/completions`) goes to the backend that the simulator's
router of the same name chooses (`paged.core.routing`), over the same view of each replica: the
requests this router has in flight there, its last scraped KV usage and its KV cache size (scraped from
`vllm:cache_config_info` unless `--num-gpu-blocks` gives it: `paged.serve.backends`);
`prefix_aware` reads the prompt's chained block ids (`paged.serve.prefix_ids`) and keeps a record of
each backend's as long as its KV cache in blocks, as the simulator's does; `kv_aware` matches a prompt's
block hashes against what each backend's KV events say it caches (`paged.serve.kv_sync`, polled every
`--kv-events-interval-s`; `--block-size` must be the backends'). A token-id prompt has its hashes as it
is; a text or chat prompt only once cut into the engine's tokens, which takes the backends' tokenizer:
with `--tokenizer MODEL` (and the backends' `--chat-template`, if they were given one) the router makes
the ids as `paged serve` does (`paged.serve.router_tokens`; `paged launch` gives it the replicas' own);
without it, kv_aware routes text and chat by load alone, as its start-up line says. Streams pass through
event by event; a client that leaves, streamed or not, has its backend request closed, which the backend
aborts. Every relayed answer names its backend's URL in an `x-paged-backend` header (`paged bench serve
--requests-csv` records it: the router's choices, request by request). `/v1/models` comes from the first
healthy backend; `/health` is 200 while one backend is in service (both answer HEAD too, for load
balancers' probes); `/metrics` counts what the router did per backend (`paged.serve.router_metrics`);
`/kv/view` shows kv_aware's view of each backend's cache (and its size). Clients' `Authorization`
headers pass through to the backends, which check them; the router's own reads of the backends' KV
events carry `--api-key` (the backends' key), which no client request ever gets.

Faults: every backend is probed each `--health-interval-s`; one that fails is taken out until it
answers again. A request that cannot connect to its backend is retried on another, and so, once, is
one whose connection breaks before the backend answers (a replica dying fails the requests
waiting on it, and the first one sent on a kept-alive connection as it dies); one whose backend
fails after that ends with HTTP 502 and an OpenAI error body, or, once its stream has started, an
error event and `data: [DONE]`. A backend that hangs is taken out at its first failed
probe, and the requests in flight there fail after `--abort-after-failed-probes` (a plain one
is then sent once more, elsewhere; whatever the probes say, a request fails at `--read-timeout-s`
without a byte). Malformed JSON is a 400 and a body over
`--max-body-bytes` a 413 (the router holds a body whole to route it), both found as the server
finds them (`paged.serve.protocol`); unknown routes and methods are 404 and 405; every refusal
has OpenAI's error shape (`paged.serve.errors`); no backend in service, a 503.

Once every backend has been probed, it prints one line (its address, policy and backends, in
service or not), at any log level but error and critical; requests are never logged one by one.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from fastapi.sse import format_sse_event
from httpx_sse import EventSource
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from paged.core.routing import DEFAULT_CACHE_THRESHOLD, DEFAULT_MAX_NUM_SEQS, ROUTERS, make_router
from paged.help_formatter import ArgumentParser, HelpFormatter

from .backends import Backend, is_server_url, probe, watch
from .disconnect import cancel_on_disconnect
from .errors import PROBED, error_events, error_response, install_error_handlers
from .kv_sync import KVSync, follow
from .prefix_ids import block_hashes, prefix_ids
from .protocol import parse_json, read_body
from .replay import BACKEND_HEADER
from .router_metrics import RouterMetrics
from .router_tokens import PromptTokens, read_chat_template
from .server_process import check_listen_address

FORWARDED_HEADERS = ("authorization", "content-type")
SECONDS_OPTIONS = ("health_interval_s", "health_timeout_s", "connect_timeout_s", "read_timeout_s",
                   "kv_events_interval_s")
QUIET_LOG_LEVELS = ("error", "critical")  # no startup line


@dataclass(slots=True)
class RouterConfig:
    backends: list[str]
    policy: str = "round_robin"
    block_size: int = 16  # tokens (characters of text) per prefix id; kv_aware: the backends' block size
    health_interval_s: float = 1.0
    health_timeout_s: float = 2.0
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 600.0  # between two reads from a backend: a non-streamed answer comes in one read
    abort_after_failed_probes: int = 3  # then the requests in flight on a backend that hangs are failed
    kv_events_interval_s: float = 0.25  # kv_aware: between two reads of a backend's KV events
    api_key: str | None = None  # the backends' key, for the router's own requests (KV events)
    tokenizer: str | None = None  # kv_aware: the backends' model (or tokenizer folder), to tokenize text prompts
    chat_template: str | None = None  # kv_aware with a tokenizer: the backends' --chat-template, if they have one
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS  # the backends' batch: sizes prefix_aware's imbalance limit
    max_body_bytes: int = 4 << 20  # larger bodies get 413 (paged serve's default limit)
    num_gpu_blocks: int | None = None  # kv_aware, prefix_aware's record: the backends' KV cache (None: as exported)
    cache_threshold: float = DEFAULT_CACHE_THRESHOLD  # prefix_aware: match rate at or below which, the smallest record


class InFlight:
    """A request's place in its backend's count of requests in flight: taken when it is sent,
    given back exactly once, however the request ends."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        backend.in_flight += 1
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.backend.in_flight -= 1


class RelayedStream(StreamingResponse):
    """A relayed event stream that closes its upstream even if its body never starts (the
    client left before the first byte): a generator's `finally` runs only once it has started."""

    def __init__(self, events, close, headers: dict) -> None:
        super().__init__(events, media_type="text/event-stream", headers=headers)
        self._close = close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._close()


class Forwarder:
    """Chooses a backend per request and relays the request there and the answer back."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        timeout = httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s)
        limits = httpx.Limits(max_connections=None)
        self.backends = [Backend(url, lambda: httpx.AsyncClient(timeout=timeout, limits=limits), config.num_gpu_blocks)
                         for url in config.backends]
        self.policy = make_router(config.policy, len(self.backends), block_size=config.block_size,
                                  hash_id_block_size=config.block_size,  # prefix_aware's ids: one per block
                                  max_num_seqs=config.max_num_seqs, cache_threshold=config.cache_threshold)
        self.metrics = RouterMetrics(self.backends)
        own = {} if config.api_key is None else {"authorization": f"Bearer {config.api_key}"}
        self.kv_syncs = ([KVSync(b, self.policy.replica_events(i), config.block_size, own)
                          for i, b in enumerate(self.backends)] if config.policy == "kv_aware" else [])
        self.prompt_tokens = PromptTokens(config.tokenizer if self.kv_syncs else None, config.chat_template)

    def prompt_key(self, path: str, payload: dict) -> list | None:
        """What the policy routes by: kv_aware, the engine's block hashes of the prompt's tokens
        (when the router can know them); prefix_aware, the prompt's prefix ids; the others, nothing."""
        if self.kv_syncs:
            ids = self.prompt_tokens(path, payload)
            return None if ids is None else block_hashes(ids, self.config.block_size)
        return prefix_ids(payload, self.config.block_size) if self.config.policy == "prefix_aware" else None

    def choose(self, key: list | None) -> Backend | None:
        """The policy's choice among the backends in service (None when there is none)."""
        for _ in range(len(self.backends)):  # round robin may land on one out of service: ask again
            i = (self.policy.route_hashes(key or [], self.backends) if self.kv_syncs
                 else self.policy.route(key, self.backends))
            backend = self.backends[i]
            if backend.healthy:
                self.metrics.routed.labels(backend.url).inc()
                return backend
        return None

    async def completion(self, request: Request, path: str) -> Response:
        """Forwarded once the body is read, and cancelled if the client leaves first: a
        non-streamed answer is read whole before anything is written to the client, so nothing
        else would notice, and the backend would compute it for no one."""
        body = await read_body(request, self.config.max_body_bytes)
        return await cancel_on_disconnect(request, self._forward(request, path, body))

    async def _forward(self, request: Request, path: str, body: bytes) -> Response:
        payload = parse_json(body)
        headers = {k: v for k, v in request.headers.items() if k in FORWARDED_HEADERS}
        key = self.prompt_key(path, payload)
        retried = False
        while (backend := self.choose(key)) is not None:
            client = backend.client
            upstream = client.build_request("POST", backend.url + path, content=body, headers=headers)
            lease = InFlight(backend)
            self.metrics.requests.labels(backend.url).inc()
            try:
                response = await client.send(upstream, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout):  # never reached the backend: try another
                lease.release()
                backend.healthy = False
                self.metrics.errors.labels(backend.url, "connect").inc()
                continue
            except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as e:
                # The connection broke before the backend answered: it died (or was stopped and its
                # requests failed), or a kept-alive connection went as it died. The client has had
                # nothing yet, so another backend can answer; once only, so that a request that
                # itself kills its backend takes down at most two.
                lease.release()
                backend.healthy = False
                if retried:
                    return self._failed(backend, e, "")
                retried = True
                self.metrics.errors.labels(backend.url, "retried").inc()
                continue
            except httpx.HTTPError as e:
                lease.release()
                return self._failed(backend, e, "")
            except BaseException:  # cancelled: the client went away
                lease.release()
                raise
            return await self._relay(backend, response, lease)
        self.metrics.rejected.labels("no_backend").inc()
        return error_response(503, "no backend is in service", code="no_backend")

    def _failed(self, backend: Backend, e: httpx.HTTPError, when: str) -> Response:
        self.metrics.errors.labels(backend.url, "interrupted").inc()
        status = 504 if isinstance(e, httpx.TimeoutException) else 502
        return error_response(status, f"backend {backend.url} failed{when}: {_describe(e)}", code="backend_failed")

    async def _relay(self, backend: Backend, response: httpx.Response, lease: InFlight) -> Response:
        if response.status_code >= 500:
            self.metrics.errors.labels(backend.url, "status").inc()

        async def close() -> None:
            lease.release()
            await response.aclose()

        named = {BACKEND_HEADER: backend.url}
        if response.status_code == 200 and response.headers.get("content-type", "").startswith("text/event-stream"):
            return RelayedStream(self._events(backend, response, close), close, named)
        try:
            content = await response.aread()
        except httpx.HTTPError as e:
            return self._failed(backend, e, " mid-request")
        finally:
            await close()
        return Response(content, response.status_code, media_type=response.headers.get("content-type"),
                        headers=named)

    async def _events(self, backend: Backend, response: httpx.Response, close):
        """The backend's events as they come; a stream cut before `[DONE]` ends with an error."""
        done = False
        try:
            async for event in EventSource(response).aiter_sse():
                done = event.data == "[DONE]"
                yield format_sse_event(data_str=event.data, event=event.event if event.event != "message" else None,
                                       id=event.id or None, retry=event.retry)
            if not done:
                raise httpx.RemoteProtocolError("the stream ended before data: [DONE]")
        except httpx.HTTPError as e:
            self.metrics.errors.labels(backend.url, "interrupted").inc()
            status = 504 if isinstance(e, httpx.TimeoutException) else 502
            yield error_events(status, f"backend {backend.url} failed mid-stream: {_describe(e)}", "backend_failed")
        finally:
            await close()

    async def models(self, request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k in FORWARDED_HEADERS}
        for backend in self.backends:
            if backend.healthy:
                try:
                    r = await backend.client.get(f"{backend.url}/v1/models", headers=headers)
                except httpx.HTTPError:
                    continue
                return Response(r.content, r.status_code, media_type=r.headers.get("content-type"))
        return error_response(503, "no backend is in service", code="no_backend")


def _describe(e: Exception) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def startup_line(listen: str, config: RouterConfig, backends: list[Backend]) -> str:
    """What the router prints once its first probes are done (as vLLM's and SGLang's routers log
    their start): at its quiet default log level it printed nothing, so a terminal, or `paged launch`'s
    router.log, showed no sign of a router, nor of its backends."""
    named = ", ".join(f"{b.url} ({'in service' if b.healthy else 'out of service'})" for b in backends)
    line = f"INFO:     paged router on {listen}: policy {config.policy}, backends {named}"
    if config.policy == "kv_aware" and config.tokenizer is None:  # said, lest a reader think chats are matched
        line += ("; no --tokenizer: text and chat prompts are routed by load alone (token-id prompts are still "
                 "matched against the caches)")
    return line


def create_app(config: RouterConfig, listen: str | None = None) -> FastAPI:
    """`listen`: the address the router is served on, printed at startup (None: print nothing)."""
    fwd = Forwarder(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # A first probe of every backend before serving: a router starts with its backends known.
        await asyncio.gather(*(probe(b, config.health_timeout_s) for b in fwd.backends))
        if listen is not None:
            print(startup_line(listen, config, fwd.backends), file=sys.stderr, flush=True)
        tasks = [asyncio.create_task(watch(b, config.health_interval_s, config.health_timeout_s,
                                           config.abort_after_failed_probes)) for b in fwd.backends]
        tasks += [asyncio.create_task(follow(s, config.kv_events_interval_s, config.health_timeout_s))
                  for s in fwd.kv_syncs]
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            for b in fwd.backends:
                await b.client.aclose()

    app = FastAPI(title="paged router", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app, lambda status: fwd.metrics.rejected.labels(
        "bad_request" if status < 500 else "internal_error").inc())

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await fwd.completion(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await fwd.completion(request, "/v1/chat/completions")

    @app.api_route("/v1/models", methods=PROBED)
    async def models(request: Request) -> Response:
        return await fwd.models(request)

    @app.api_route("/health", methods=PROBED)
    async def health() -> Response:
        n = sum(b.healthy for b in fwd.backends)
        if n:
            return Response(json.dumps({"status": "ok", "backends_in_service": n}), media_type="application/json")
        return error_response(503, "no backend is in service", code="no_backend")

    @app.get("/kv/view")
    async def kv_view() -> Response:
        """kv_aware's view of each backend's cache: its size in blocks (null while unknown), the hashes (hex)
        and the event seq it is current to."""
        return Response(json.dumps({"backends": [
            {"url": s.backend.url, "num_gpu_blocks": s.backend.num_gpu_blocks, "epoch": s.epoch, "seq": s.seq,
             "blocks": sorted(h.hex() for h in s.view.hashes)} for s in fwd.kv_syncs]}), media_type="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(fwd.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def build_parser() -> argparse.ArgumentParser:
    d = RouterConfig([])
    p = ArgumentParser(prog="paged router", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--backend", action="append", required=True, metavar="URL",
                   help="an OpenAI-compatible server (repeat for each)")
    p.add_argument("--policy", default=d.policy, choices=ROUTERS, help="the routing policy")
    p.add_argument("--host", default="127.0.0.1", help="host name to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8080, help="port number")
    p.add_argument("--block-size", type=int, default=d.block_size,
                   help="prefix_aware: tokens (characters, for text prompts) per prefix id; kv_aware: the "
                        "backends' --block-size")
    p.add_argument("--health-interval-s", type=float, default=d.health_interval_s,
                   help="seconds between two probes of each backend's /health")
    p.add_argument("--health-timeout-s", type=float, default=d.health_timeout_s,
                   help="seconds a probe (and a read of KV events) may take before it counts as failed")
    p.add_argument("--connect-timeout-s", type=float, default=d.connect_timeout_s,
                   help="seconds to connect to a backend before the request goes to another")
    p.add_argument("--read-timeout-s", type=float, default=d.read_timeout_s,
                   help="seconds of the longest wait between two reads from a backend")
    p.add_argument("--abort-after-failed-probes", type=int, default=d.abort_after_failed_probes,
                   help="fail the requests in flight on a backend after this many failed probes in a row")
    p.add_argument("--kv-events-interval-s", type=float, default=d.kv_events_interval_s,
                   help="kv_aware: seconds between two reads of each backend's KV events")
    p.add_argument("--api-key", default=os.environ.get("PAGED_API_KEY"),
                   help="the backends' --api-key (default $PAGED_API_KEY), sent on the router's own requests to "
                        "them: kv_aware's reads of /kv/events and /kv/blocks. Clients' requests are passed on "
                        "with their own Authorization header, never this key")
    p.add_argument("--tokenizer", default=None, metavar="MODEL",
                   help="kv_aware: the backends' model (a name or path, as paged serve --model takes it; or their "
                        "--tokenizer folder), whose tokenizer cuts text and chat prompts into the engine's tokens "
                        "(default: none, and kv_aware routes text and chat prompts by load alone; loading it "
                        "imports torch)")
    p.add_argument("--chat-template", default=None,
                   help="with --tokenizer: the backends' --chat-template (a template or a file), if they have one")
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs,
                   help="prefix_aware: the backends' --max-num-seqs, which sizes how much more loaded than the "
                        "lightest a prefix's backend may be: paged.core.routing.balance_threshold")
    p.add_argument("--cache-threshold", type=float, default=d.cache_threshold,
                   help="prefix_aware: the match rate (the prompt's prefix ids the router sent to one backend before, "
                        "over its prefix ids) above which a request goes to the backend of the longest match; at or "
                        "below, to the backend the router sent the least prefixes it still records (the most room "
                        "in its cache), as SGLang router's --cache-threshold")
    p.add_argument("--num-gpu-blocks", type=int, default=d.num_gpu_blocks,
                   help="the backends' KV cache in blocks (their num_gpu_blocks). kv_aware: it tells when a "
                        "request would wait there for memory; while another backend is idle, what such a backend "
                        "caches counts for nothing. prefix_aware: its record of a backend keeps as many prefix ids "
                        "(one a block), none forgotten while the size is unknown. Given, it wins for every backend. "
                        "Default: each backend's own, as its /metrics exports it in vllm:cache_config_info (vLLM "
                        "and paged serve do); a backend that does not is full only at 100%% KV usage")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                   help="larger request bodies get 413, in bytes; at least the backends' --max-body-bytes")
    p.add_argument("--log-level", default="warning", help="log level for uvicorn")
    return p


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = build_parser()
    args = parser.parse_args(argv)
    for url in args.backend:  # a typo here would only show as a backend out of service, forever
        if not is_server_url(url):
            parser.error(f"--backend {url}: expected a server's URL, such as http://127.0.0.1:8000")
    for option in ("block_size", "max_num_seqs", "abort_after_failed_probes", "max_body_bytes"):
        if (value := getattr(args, option)) < 1:
            parser.error(f"--{option.replace('_', '-')} {value}: expected at least 1")
    if args.num_gpu_blocks is not None and args.num_gpu_blocks < 1:
        parser.error(f"--num-gpu-blocks {args.num_gpu_blocks}: expected at least 1")
    if not 0 <= args.cache_threshold <= 1:  # NaN too
        parser.error(f"--cache-threshold {args.cache_threshold}: expected a number in [0, 1]")
    for option in SECONDS_OPTIONS:  # 0 would probe or poll in a busy loop, NaN compare false everywhere
        if not 0 < (value := getattr(args, option)) < math.inf:
            parser.error(f"--{option.replace('_', '-')} {value}: expected a finite number of seconds > 0")
    try:  # the app too: kv_aware loads --tokenizer there, and a model it cannot find is a usage error
        check_listen_address(args.host, args.port)
        chat_template = read_chat_template(args.chat_template)
        config = RouterConfig(args.backend, args.policy, args.block_size, args.health_interval_s,
                              args.health_timeout_s, args.connect_timeout_s, args.read_timeout_s,
                              args.abort_after_failed_probes, args.kv_events_interval_s, args.api_key, args.tokenizer,
                              chat_template, args.max_num_seqs, args.max_body_bytes, args.num_gpu_blocks,
                              args.cache_threshold)
        host = f"[{args.host}]" if ":" in args.host else args.host  # IPv6, as in a URL
        listen = None if args.log_level.lower() in QUIET_LOG_LEVELS else f"http://{host}:{args.port}"
        app = create_app(config, listen)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    return 0
