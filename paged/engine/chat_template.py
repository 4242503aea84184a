"""Chat messages -> prompt text, with the model's own Jinja template rendered as transformers does.

The template comes from the model (GGUF `tokenizer.chat_template`, or an HF folder's
`tokenizer_config.json` / `chat_template.jinja`) or from the caller. It runs in jinja2's
immutable sandbox, with transformers' environment: `trim_blocks`, `lstrip_blocks`, loop controls,
`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII text, and the special tokens
(`bos_token`, `eos_token`) as strings. The rendered text already holds whatever special tokens
the template wants, so it is tokenized without adding any (as transformers and vLLM do).

Shared by `LLM.chat` and the OpenAI-compatible server; every problem is a ValueError naming it.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def check_messages(messages) -> list[dict]:
    """OpenAI-style messages, checked: a non-empty list of objects with a non-empty string `role`
    and a `content` that is a string, a list of text parts (joined with newlines, as vLLM does),
    or null for an assistant turn. Returns copies with content as a string; other keys pass."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"messages={_short(messages)}: expected a non-empty list of message objects")
    checked = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise ValueError(f"{where}={_short(m)}: expected an object with 'role' and 'content'")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError(f"{where}.role={_short(role)}: expected a non-empty string")
        if "content" not in m and role != "assistant":
            raise ValueError(f"{where}: missing 'content'")
        content = m.get("content")
        if isinstance(content, (list, tuple)):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(f"{where}.content[{j}]={_short(part)}: expected {{'type': 'text', 'text': "
                                     f"<string>}} (only text is supported)")
                texts.append(part["text"])
            content = "\n".join(texts)
        elif content is None and role != "assistant":
            raise ValueError(f"{where}.content is null: only an assistant message may have no content")
        elif content is not None and not isinstance(content, str):
            raise ValueError(f"{where}.content={_short(content)}: expected a string or a list of text parts")
        checked.append({**m, "content": content})
    return checked


def render_chat(template: str | None, messages, *, bos_token: str | None = None, eos_token: str | None = None,
                add_generation_prompt: bool = True, **kwargs) -> str:
    """The prompt text for `messages` (checked first). `kwargs` reach the template as variables
    (vLLM's chat_template_kwargs), e.g. `tools`."""
    if template is None:
        raise ValueError("this model has no chat template: pass chat_template=<a Jinja template>")
    if not isinstance(template, str):
        raise ValueError(f"chat_template of type {type(template).__name__}: expected a string")
    if not isinstance(add_generation_prompt, bool):
        raise ValueError(f"add_generation_prompt={add_generation_prompt!r}: expected True or False")
    messages = check_messages(messages)
    try:
        return _compile(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=bos_token or "", eos_token=eos_token or "", **kwargs)
    except jinja2.TemplateError as e:  # raise_exception(), syntax, undefined names, the sandbox
        raise ValueError(f"chat template: {e}") from None


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise ValueError(f"chat template does not parse: {e}") from None


def _raise(message):
    raise jinja2.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
