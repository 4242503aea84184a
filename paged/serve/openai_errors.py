"""Errors as OpenAI-compatible clients expect them: a JSON body `{"error": {"message", "type",
"param", "code"}}` with the HTTP status, or, once a stream has started (its status already
sent), a final SSE event carrying the same object followed by `data: [DONE]`, so that a client
reading the stream ends with an error instead of waiting for tokens that will not come."""
from __future__ import annotations

import json

from fastapi.responses import JSONResponse
from fastapi.sse import format_sse_event

# HTTP status -> the `type` OpenAI's API gives errors of that status
ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 502: "bad_gateway", 503: "service_unavailable",
               504: "timeout"}


def error_object(message: str, status: int, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": param,
                      "code": code}}


def error_response(message: str, status: int, code: str | None = None, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_object(message, status, code, param), status_code=status)


def error_events(message: str, status: int, code: str | None = None) -> bytes:
    """The end of a stream that failed after it started: the error as an event, then [DONE]."""
    return (format_sse_event(data_str=json.dumps(error_object(message, status, code)))
            + format_sse_event(data_str="[DONE]"))
