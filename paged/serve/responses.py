"""Engine outputs -> OpenAI response bodies: completions and chat, whole or as stream chunks.

A request with P prompts and n samples each has P * n choices, choice `p * n + i` being sample
`i` of prompt `p` (vLLM's numbering). The engine's outputs are cumulative; streaming sends the
part of each choice not sent before. `usage` counts each prompt once and every sample's tokens.
"""
from __future__ import annotations

import time

from paged.engine import CompletionOutput, RequestOutput


class ResponseBuilder:
    def __init__(self, chat: bool, response_id: str, model: str, n: int, return_token_ids: bool) -> None:
        self.chat, self.id, self.model, self.n = chat, response_id, model, n
        self.return_token_ids = return_token_ids
        self.created = int(time.time())
        self._sent: dict[int, tuple[int, int]] = {}  # choice -> (characters, tokens) already streamed
        self._done: set[int] = set()

    def _envelope(self, choices: list[dict], stream: bool) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if stream and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    # -- whole responses ----------------------------------------------------------------------
    def response(self, outputs: list[RequestOutput]) -> dict:
        choices = []
        for p, out in enumerate(outputs):
            for c in out.outputs:
                choice = {"index": p * self.n + c.index, "logprobs": None, "finish_reason": c.finish_reason,
                          "stop_reason": c.stop_reason}
                if self.chat:
                    choice["message"] = {"role": "assistant", "content": c.text}
                else:
                    choice["text"] = c.text
                if self.return_token_ids:
                    choice["prompt_token_ids"], choice["token_ids"] = out.prompt_token_ids, c.token_ids
                choices.append(choice)
        return {**self._envelope(choices, stream=False), "usage": usage(outputs)}

    # -- streaming ----------------------------------------------------------------------------
    def chunk(self, prompt_index: int, out: RequestOutput, include_usage: bool) -> dict | None:
        """The stream chunk for what this output adds; None when it adds nothing."""
        choices = [c for c in (self._delta(prompt_index * self.n + c.index, c) for c in out.outputs) if c]
        if not choices:
            return None
        chunk = self._envelope(choices, stream=True)
        if include_usage:
            chunk["usage"] = None  # only the last chunk carries usage, as OpenAI does
        return chunk

    def _delta(self, index: int, c: CompletionOutput) -> dict | None:
        if index in self._done:
            return None
        first = index not in self._sent
        chars, tokens = self._sent.get(index, (0, 0))
        text, new_tokens = c.text[chars:], c.token_ids[tokens:]
        if not text and not new_tokens and c.finish_reason is None and not first:
            return None
        self._sent[index] = (len(c.text), len(c.token_ids))
        if c.finish_reason is not None:
            self._done.add(index)
        choice = {"index": index, "logprobs": None, "finish_reason": c.finish_reason}
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
        else:
            choice["text"] = text
        if c.finish_reason is not None:
            choice["stop_reason"] = c.stop_reason
        if self.return_token_ids:
            choice["token_ids"] = new_tokens
        return choice

    def usage_chunk(self, outputs: list[RequestOutput]) -> dict:
        return {**self._envelope([], stream=True), "usage": usage(outputs)}


def usage(outputs: list[RequestOutput]) -> dict:
    """OpenAI's usage, with `prompt_tokens_details.cached_tokens` as vLLM reports it: the prompt
    tokens each prompt found in the prefix cache when it was admitted (a client can then tell a
    request's prefix hit from its latency's other causes)."""
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(o.metrics.num_cached_tokens for o in outputs)}}
