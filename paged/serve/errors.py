"""Errors as OpenAI's API returns them: a status code and `{"error": {"message", "type", "param", "code"}}`,
for the server and the router alike.

Everything the server refuses is raised as an `APIError`; the app's handlers turn it, FastAPI's
own HTTP errors (404 route, 405, 413 from the body limit), its validation of query parameters
(a 400, as vLLM answers it, not FastAPI's 422 `detail` list) and any unexpected exception into
this one shape, so a client always reads the same body and no request can take the server down.
A client that leaves while its body arrives is no error of the server's: an empty 499, uncounted.
"""
from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.sse import format_sse_event
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from .disconnect import CLIENT_CLOSED

log = logging.getLogger("paged.serve")

# The methods of the routes that probes read (/health, /v1/models). HEAD is answered as GET, its body
# left out by uvicorn: load balancers' health checks and `curl -I` send it, and HTTP requires it
# wherever GET is served (RFC 9110 9.1). FastAPI's routes take only the methods named, so vLLM,
# whose /health and /v1/models are plain `get` routes, answers HEAD with 405. OPTIONS stays a 405,
# as a plain one is in vLLM.
PROBED = ["GET", "HEAD"]

# OpenAI's error types by status
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          413: "invalid_request_error", 503: "service_unavailable_error"}
# "SamplingParams.top_p=7: ..." (validation), "request 'x' rejected: n=17 exceeds max_num_seqs=16" (the scheduler)
_SAMPLING_FIELD = re.compile(r"(?:^SamplingParams\.|rejected: )(\w+)=")


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers

    @classmethod
    def bad_request(cls, e: ValueError) -> APIError:
        """A ValueError from the engine or the core, as a 400 naming the field it names."""
        message = str(e)
        m = _SAMPLING_FIELD.search(message)
        param = m.group(1) if m else "messages" if "messages" in message else "prompt" if "prompt" in message else None
        return cls(400, message, param)


def error_body(status: int, message: str, param: str | None = None, code: str | int | None = None) -> dict:
    """`code` defaults to the status; the router names what failed instead ("backend_failed")."""
    phrase = HTTPStatus(status).phrase.replace(" ", "")
    return {"error": {"message": message, "type": _TYPES.get(status, phrase if status < 500 else "server_error"),
                      "param": param, "code": status if code is None else code}}


def error_response(status: int, message: str, param: str | None = None, headers: dict | None = None,
                   code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def error_events(status: int, message: str, code: str | None = None) -> bytes:
    """The end of a stream that failed after it started (its status already sent): the error as a
    final SSE event, then `data: [DONE]`, so that a client reading the stream ends with an error
    instead of waiting for tokens that will not come."""
    return (format_sse_event(data_str=json.dumps(error_body(status, message, code=code)))
            + format_sse_event(data_str="[DONE]"))


def install_error_handlers(app: FastAPI, on_error: Callable[[int], None]) -> None:
    """Every error answer goes through these handlers; `on_error(status)` counts each."""
    def respond(status: int, message: str, param: str | None = None, headers: dict | None = None) -> JSONResponse:
        on_error(status)
        return error_response(status, message, param, headers)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return respond(e.status, e.message, e.param, e.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        return respond(e.status_code, str(e.detail), None, getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid_parameter(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0]
        name = str(first["loc"][-1])
        return respond(400, f"{name}={first.get('input')!r}: {first['msg']}", name)

    @app.exception_handler(ClientDisconnect)
    async def client_left(request: Request, e: ClientDisconnect) -> Response:
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, e: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return respond(500, f"internal error: {type(e).__name__}: {e}")
