"""The token ids a replica will see for a request, as the router can know them: given (a token-id
prompt), or made with the replicas' own tokenizer (`paged router --tokenizer`) the way `paged
serve` makes them, so that kv_aware can match a text or chat prompt block for block against the
replicas' caches (llm-d's precise prefix-cache scorer tokenizes in the router for the same reason).

A completion's text is `Tokenizer.encode`d (BOS rule included), as `LLMEngine.add_request` does;
chat messages are rendered and tokenized by `Tokenizer.chat_prompt`, the very function the
server calls, with the request's `add_generation_prompt` and `chat_template_kwargs` and the
router's `--chat-template` (which must be the replicas' own, if they were given one). A request
the router cannot tokenize (malformed messages, a template error) gets None and is routed by
load; its replica answers it with the error. Loading the tokenizer imports the engine package
(torch): a router without `--tokenizer` never does.
"""
from __future__ import annotations

from pathlib import Path

from .prefix_ids import first_prompt, token_ids

CHAT_PATH = "/v1/chat/completions"


def read_chat_template(value: str | None) -> str | None:
    """`--chat-template` (of `paged serve` and `paged router`): a Jinja template, or a file holding
    one. A value that is neither (no such file, and no Jinja tag in it: a mistyped path) is an
    error, not a template that would render that text for every chat."""
    if value is None:
        return None
    try:
        is_file = Path(value).is_file()
    except OSError:  # such as a name too long for a path: a template written out, as most are
        is_file = False
    if is_file:
        return Path(value).read_text()
    if "{{" not in value and "{%" not in value:
        raise ValueError(f"--chat-template {value!r}: no such file, and not a Jinja template (no {{{{ or {{% in "
                         "it); expected a template or a file holding one")
    return value


def load_tokenizer_option(value: str):
    """`--tokenizer` (of `paged serve` and `paged router`): a model's name or path, checked as
    `paged serve --model` checks it; one that is not found, or has no tokenizer, is a ValueError
    naming --tokenizer (a usage error), not the loader's own message blaming --model."""
    from paged.engine.loader import load_tokenizer

    try:
        tokenizer = load_tokenizer(value)
    except (ValueError, OSError) as e:
        raise ValueError(f"--tokenizer {value}: {e}") from None
    if tokenizer is None:
        raise ValueError(f"--tokenizer {value}: the model has no tokenizer (no tokenizer.json)")
    return tokenizer


class PromptTokens:
    def __init__(self, tokenizer: str | None = None, chat_template: str | None = None) -> None:
        """`tokenizer`: a model name or path as `paged serve --model` takes it (or its `--tokenizer`
        folder); None: token-id prompts only. `chat_template`: a template or a file holding one."""
        self.tokenizer = None if tokenizer is None else load_tokenizer_option(tokenizer)
        self.chat_template = read_chat_template(chat_template)

    def __call__(self, path: str, body: dict) -> list[int] | None:
        """The token ids of the request's (first) prompt; None when they cannot be known here."""
        tok = self.tokenizer
        if path == CHAT_PATH:
            if tok is None:
                return None
            kwargs = body.get("chat_template_kwargs") or {}
            add = body.get("add_generation_prompt")
            try:
                return tok.chat_prompt(body.get("messages"), self.chat_template, True if add is None else add,
                                       **kwargs)["prompt_token_ids"]
            except (ValueError, TypeError):
                return None
        ids = token_ids(body)
        if ids is not None or tok is None:
            return ids
        prompt = first_prompt(body)
        return tok.encode(prompt) if isinstance(prompt, str) and prompt else None
