"""Chained prefix ids of an OpenAI request, for the prefix-aware router.

A request's prompt is cut into blocks of `block_size` tokens and each full block is named by
the chained hash of everything up to its end (`paged.core.hashing.hash_token_block`), so two
requests get equal leading ids exactly as far as their prompts agree block for block, as the
engine's prefix cache would see them.

Token ids are used when the request gives them (`prompt` as a list of ints, or a batch of such
lists: the first one). For text (a `prompt` string, or chat `messages`) the router has no
tokenizer: each character stands for a token, i.e. each `block_size`-character chunk of the text
is hashed as a block. That is deterministic and agrees wherever the texts agree, which is what
routing needs; it does not line up with the engine's token blocks, so it predicts which replica
holds a prefix, not how many blocks of it.
"""
from __future__ import annotations

import json

from paged.core.hashing import hash_token_block


def prefix_ids(body: dict, block_size: int) -> list[int] | None:
    """One id per full block of the request's prompt; None when the request has no prompt the
    router can read (the backend will say what is wrong with it)."""
    tokens = _prompt_tokens(body)
    if tokens is None:
        return None
    ids, prev = [], None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        prev = hash_token_block(prev, tokens[start:start + block_size])
        ids.append(int.from_bytes(prev[:8], "little"))
    return ids


def _prompt_tokens(body: dict) -> list[int] | None:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]  # a batch: route by its first prompt
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    if isinstance(prompt, str):
        return [ord(c) for c in prompt]
    messages = body.get("messages")
    if isinstance(messages, list):
        return [ord(c) for c in "".join(_message_text(m) for m in messages)]
    return None


def _message_text(message) -> str:
    if not isinstance(message, dict):
        return json.dumps(message, sort_keys=True)
    content = message.get("content")
    if isinstance(content, list):  # parts: text as it is, anything else (an image) by its JSON
        content = "".join(p["text"] if isinstance(p, dict) and isinstance(p.get("text"), str)
                          else json.dumps(p, sort_keys=True) for p in content)
    return f"<|{message.get('role')}|>{content if isinstance(content, str) else ''}"
