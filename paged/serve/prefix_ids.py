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

`token_block_hashes` is for `kv_aware`, which matches a prompt against the block hashes the
replicas report (the engine's own chained hashes, from the same function): a token-id prompt has
them; a text or chat prompt only through the replicas' tokenizer (`router_tokens`, `paged router
--tokenizer`), and without one gets None and is routed by load alone.
"""
from __future__ import annotations

import json

from paged.core import hashing


def prefix_ids(body: dict, block_size: int) -> list[int] | None:
    """One id per full block of the request's prompt; None when the request has no prompt the
    router can read (the backend will say what is wrong with it)."""
    tokens = _prompt_tokens(body)
    if tokens is None:
        return None
    return [int.from_bytes(h[:8], "little")
            for h in hashing.token_block_hashes(tokens, block_size, len(tokens) // block_size)]


def token_block_hashes(body: dict, block_size: int) -> list[bytes] | None:
    """The engine's hashes of the full blocks of a token-id prompt (the first of a batch); None
    for a text prompt, whose tokens only the model's tokenizer knows."""
    tokens = token_ids(body)
    return None if tokens is None else block_hashes(tokens, block_size)


def block_hashes(tokens: list[int], block_size: int) -> list[bytes]:
    """The engine's chained hashes of the full blocks of `tokens`."""
    return hashing.token_block_hashes(tokens, block_size, len(tokens) // block_size)


def first_prompt(body: dict):
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        return prompt[0]  # a batch: route by its first prompt
    return prompt


def token_ids(body: dict) -> list[int] | None:
    prompt = first_prompt(body)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    return None


def _prompt_tokens(body: dict) -> list[int] | None:
    tokens = token_ids(body)
    if tokens is not None:
        return tokens
    prompt = first_prompt(body)
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
