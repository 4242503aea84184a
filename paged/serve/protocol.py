"""OpenAI request bodies -> what the engine takes: prompts and `SamplingParams`.

Fields keep OpenAI's names, plus vLLM's extensions (`top_k`, `min_tokens`, `ignore_eos`,
`stop_token_ids`, `return_token_ids`, `chat_template_kwargs`, `add_generation_prompt`).
Every bad field is an `APIError` 400 naming it; the values themselves are checked where every
request enters the engine (`SamplingParams.validate`), so the HTTP layer adds no second set of
rules. Fields the engine cannot honour are refused unless they hold their neutral value, rather
than silently ignored; other unknown fields are ignored, as vLLM does, with a log warning naming
them, as vLLM logs it (a misspelt `temprature` otherwise gave a normal completion and no sign).

Context length, as vLLM's server: a prompt must leave room for at least one output token, and
a `max_tokens` (or `max_completion_tokens`) that would take the sequence past max_model_len is
a 400 naming the model's context length, the total asked for and its split (`fit_context`),
not a silent cap. Left out, `max_tokens` is what is left of the context (chat), or OpenAI's 16
if that much is left (completions). The engine's own API (`LLM.generate`) caps instead, as
vLLM's `LLM` does: a sequence stops at max_model_len with finish_reason "length".
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

from fastapi import Request

from paged import SamplingParams
from paged.core.validation import is_int

from .errors import APIError, log

# OpenAI/vLLM name -> SamplingParams field, where they differ
_RENAMED = {"max_completion_tokens": "max_tokens"}
_SAMPLING = ("max_tokens", "temperature", "top_p", "top_k", "seed", "n", "stop", "stop_token_ids", "ignore_eos",
             "min_tokens")
# Accepted only at their neutral values: anything else would be silently wrong.
_NEUTRAL = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "presence_penalty": (None, 0),
            "frequency_penalty": (None, 0), "repetition_penalty": (None, 1), "echo": (None, False),
            "suffix": (None, ""), "logit_bias": (None, {}), "tools": (None, []), "tool_choice": (None, "none"),
            "response_format": (None, {"type": "text"})}

# The fields each route reads (or accepts at their neutral values); OpenAI's `user` is read by no server.
_COMMON = {"model", "stream", "stream_options", "return_token_ids", "user", *_SAMPLING, *_RENAMED, *_NEUTRAL}
_COMPLETION_FIELDS = frozenset({*_COMMON, "prompt"})
_CHAT_FIELDS = frozenset({*_COMMON, "messages", "chat_template_kwargs", "add_generation_prompt"})

# Template variables the server sets itself.
_RESERVED = {"messages", "add_generation_prompt", "chat_template", "bos_token", "eos_token"}


@dataclass(slots=True)
class GenerateRequest:
    """One parsed request: the engine prompts (one per choice group) and how to answer.

    `params` holds `max_tokens` as asked, or `default_max_tokens` when `max_tokens` is None (not
    asked): what `fit_context` turns into each prompt's own limit."""

    model: str
    prompts: list
    params: SamplingParams
    stream: bool
    include_usage: bool
    return_token_ids: bool
    max_tokens: int | None
    default_max_tokens: int


def fit_context(req: GenerateRequest, num_prompt_tokens: int, max_model_len: int, chat: bool) -> SamplingParams:
    """The sampling params for one prompt of `num_prompt_tokens`: an APIError 400 when the prompt
    leaves no room for an output token or the asked `max_tokens` does not fit in max_model_len;
    without `max_tokens`, the default cut to what is left of the context."""
    words = "messages" if chat else "prompt"
    room = max_model_len - num_prompt_tokens
    if room < 1:
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens "
                            f"(max_model_len={max_model_len}). However, your request has {num_prompt_tokens} input "
                            f"tokens, which leaves no room for a completion. Please reduce the length of the {words}.",
                       words)
    if req.max_tokens is not None:
        if req.max_tokens > room:
            raise APIError(400, f"This model's maximum context length is {max_model_len} tokens. However, you "
                                f"requested {num_prompt_tokens + req.max_tokens} tokens ({num_prompt_tokens} in the "
                                f"{words}, {req.max_tokens} in the completion). Please reduce the length of the "
                                f"{words} or completion.", "max_tokens")
        return req.params
    if req.default_max_tokens <= room:
        return req.params
    try:
        return replace(req.params, max_tokens=room)
    except ValueError as e:  # min_tokens more than what is left
        raise APIError.bad_request(e) from None


async def json_body(request: Request, limit: int) -> dict:
    """The body as a JSON object: its declared type checked, its size limited, its text valid."""
    check_content_type(request.headers.get("content-type"))
    return parse_json(await read_body(request, limit))


def check_content_type(content_type: str | None) -> None:
    """A body declared as anything but JSON (`application/json` or `application/*+json`) is a 400,
    as FastAPI, and so vLLM, answers it: `curl -d` declares form encoding. One that declares no
    type is read as JSON, as before: clients that send raw bytes often leave it out."""
    if not content_type:
        return
    media = content_type.partition(";")[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise APIError(400, f"Content-Type {content_type!r}: expected application/json")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed `limit` bytes: from its
    declared length, or while it arrives (a chunked body declares none)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"the body has {declared} bytes: the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"the body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except RecursionError:
        raise APIError(400, "the body nests JSON too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:  # ValueError: also an int of more than 4300 digits
        raise APIError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the body is a JSON {type(body).__name__}: expected an object")
    if _SURROGATE_ESCAPE.search(raw):
        where = _lone_surrogate(body)
        if where is not None:
            raise APIError(400, f"{where} holds a lone surrogate (a \\ud800-\\udfff escape without its pair): "
                                f"expected valid Unicode text", where.partition(".")[0].partition("[")[0])
    return body


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _lone_surrogate(body: dict) -> str | None:
    """Where in `body` a string (or key) holds half a UTF-16 pair, which JSON can escape but no
    UTF-8 text holds (the tokenizer refuses it; an error quoting it cannot be sent); None if none.
    Walked with a stack, not recursion: the body may nest as deeply as the parser allowed."""
    stack: list[tuple[str, object]] = [("", body)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if not _is_utf8(value):
                return where.encode("utf-8", "backslashreplace").decode()
        elif isinstance(value, dict):
            for k, v in reversed(value.items()):
                path = f"{where}.{k}" if where else k
                stack.append((path, v) if _is_utf8(k) else (path, k))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return None


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_model(body: dict, served: list[str]) -> str:
    """The model asked for (the first served name when omitted, as vLLM); 404 for any other."""
    model = body.get("model")
    if model is None:
        return served[0]
    if model not in served:
        raise APIError(404, f"The model `{model}` does not exist (served: {served}).", "model")
    return model


def warn_ignored(body: dict, known: frozenset[str]) -> None:
    """A log warning naming the body's fields that no code reads, in vLLM's words; the request goes on."""
    if ignored := sorted(set(body) - known):
        log.warning("The following fields were present in the request but ignored: %s", ignored)


def completion_request(body: dict, served: list[str]) -> GenerateRequest:
    model = check_model(body, served)
    warn_ignored(body, _COMPLETION_FIELDS)
    params, asked = _sampling_params(body, default_max_tokens=16)
    return GenerateRequest(model, _prompts(body.get("prompt")), params, *_stream_options(body),
                           _flag(body, "return_token_ids"), asked, 16)


def chat_request(body: dict, served: list[str], max_model_len: int) -> tuple[GenerateRequest, dict]:
    """The request (prompts still empty: rendering needs the engine's template) and the keyword
    arguments of `LLMEngine.chat_prompt`: messages, template variables, add_generation_prompt."""
    model = check_model(body, served)
    warn_ignored(body, _CHAT_FIELDS)
    if "messages" not in body:
        raise APIError(400, "missing 'messages': expected a list of {role, content} objects", "messages")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict) or _RESERVED & set(kwargs):
        raise APIError(400, f"chat_template_kwargs={_short(kwargs)}: expected an object of template variables "
                            f"other than {sorted(_RESERVED)}", "chat_template_kwargs")
    chat = {"messages": body["messages"], "add_generation_prompt": _flag(body, "add_generation_prompt", True),
            **kwargs}
    # No max_tokens: what is left of max_model_len after the prompt (`fit_context`), as vLLM.
    params, asked = _sampling_params(body, default_max_tokens=max_model_len)
    return GenerateRequest(model, [], params, *_stream_options(body), _flag(body, "return_token_ids"), asked,
                           max_model_len), chat


def _prompts(prompt) -> list:
    """OpenAI's four spellings: a text, a list of texts, token ids, a list of token-id lists."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(is_int(t) for t in prompt):
            return [prompt]
        if all(isinstance(p, list) and p and all(is_int(t) for t in p) for p in prompt):
            return list(prompt)
    raise APIError(400, f"prompt={_short(prompt)}: expected a string, a list of strings, a list of token ids or a "
                        f"list of non-empty token-id lists", "prompt")


def _sampling_params(body: dict, default_max_tokens: int) -> tuple[SamplingParams, int | None]:
    """The params (with `default_max_tokens` unless the body sets it) and the max_tokens asked for."""
    for name, neutral in _NEUTRAL.items():
        if name in body and body[name] not in neutral:
            raise APIError(400, f"{name}={_short(body[name])} is not supported by this server", name)
    fields = {"max_tokens": default_max_tokens}
    for name, value in body.items():
        field = _RENAMED.get(name, name)
        if field in _SAMPLING and value is not None:
            fields[field] = value
    try:
        params = SamplingParams(**fields)
    except ValueError as e:
        raise APIError.bad_request(e) from None
    return params, params.max_tokens if _asks_max_tokens(body) else None


def _asks_max_tokens(body: dict) -> bool:
    return any(body.get(name) is not None for name in ("max_tokens", "max_completion_tokens"))


def _stream_options(body: dict) -> tuple[bool, bool]:
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise APIError(400, "stream_options is only allowed with stream=true", "stream_options")
    if not isinstance(options, dict):
        raise APIError(400, f"stream_options={_short(options)}: expected an object", "stream_options")
    return stream, _flag(options, "include_usage", name="stream_options.include_usage")


def _flag(body: dict, key: str, default: bool = False, name: str | None = None) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(400, f"{name or key}={_short(value)}: expected true or false", name or key)
    return value


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
