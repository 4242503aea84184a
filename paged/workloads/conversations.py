"""Synthetic multi-turn conversations: each turn's prompt is the whole conversation so far (a
system prompt, every earlier user message and answer) plus a new user message, as a chat client
sends it; the next turn arrives after a think time.

The requests carry prefix ids, one per `block_size` tokens of the conversation (ids shared by
all conversations for the system prompt, then ids of the conversation's own), so that a turn's
ids extend the previous turn's and a prefix cache can serve the history. A turn's ids name its
answer too (`Workload.ids_cover_output`): an engine caches the answer's blocks as it writes them,
and the next turn, whose prompt holds the answer, hits them. Routers see only the prompt's ids.

Arrivals are open-loop: conversations start as a Poisson process, and a turn arrives a think
time (exponential) after the previous one arrived, whether it has been answered or not, so a
think time should exceed the latency it is meant to follow.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .workload import Workload


@dataclass(frozen=True, slots=True)
class ConversationShape:
    num_conversations: int = 500
    rate: float = 1.0  # conversations starting per second
    mean_turns: float = 6.0  # turns per conversation: 1 + Poisson(mean - 1)
    think_time_s: float = 30.0  # mean seconds between a turn's arrival and the next
    system_prompt_tokens: int = 512  # shared by every conversation (a multiple of block_size)
    user_tokens: float = 150.0  # mean of a user message (lognormal, sigma 0.8)
    output_tokens: float = 300.0  # mean of an answer (lognormal, sigma 0.8)
    max_model_len: int = 8192  # a conversation ends before a turn would outgrow the context


def _lognormal(rng: np.random.Generator, mean: float, n: int) -> np.ndarray:
    sigma = 0.8
    return np.maximum(1, rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, n)).astype(np.int64)


def conversation_workload(shape: ConversationShape = ConversationShape(), seed: int = 0, block_size: int = 16,
                          name: str = "conversations") -> Workload:
    s = shape
    if s.system_prompt_tokens % block_size:
        raise ValueError(f"system_prompt_tokens={s.system_prompt_tokens}: expected a multiple of {block_size}")
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.exponential(1 / s.rate, s.num_conversations))
    turns = 1 + rng.poisson(s.mean_turns - 1, s.num_conversations)
    system_ids = list(range(s.system_prompt_tokens // block_size))
    next_id = len(system_ids)
    arrival, prompt, output, ids = [], [], [], []
    for c in range(s.num_conversations):
        users, answers = _lognormal(rng, s.user_tokens, turns[c]), _lognormal(rng, s.output_tokens, turns[c])
        thinks = rng.exponential(s.think_time_s, turns[c])
        history, t = s.system_prompt_tokens, starts[c]
        own = []  # this conversation's ids, one per block of its history past the system prompt
        for k in range(turns[c]):
            p = history + int(users[k])
            if p + int(answers[k]) > s.max_model_len:
                break
            need = -(-(p + int(answers[k]) - s.system_prompt_tokens) // block_size)
            extra = max(0, need - len(own))
            own.extend(range(next_id, next_id + extra))
            next_id += extra
            arrival.append(t)
            prompt.append(p)
            output.append(int(answers[k]))
            ids.append(system_ids + own[:need])
            history = p + int(answers[k])
            t += thinks[k]
    order = np.argsort(np.asarray(arrival), kind="stable")
    lens = np.array([len(ids[i]) for i in order], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(lens)))
    values = np.fromiter((x for i in order for x in ids[i]), dtype=np.int64, count=int(offsets[-1]))
    arrival_s = np.asarray(arrival)[order]
    return Workload(arrival_s - arrival_s[0], np.asarray(prompt, dtype=np.int64)[order],
                    np.asarray(output, dtype=np.int64)[order], prefix_index=np.arange(len(order), dtype=np.int64),
                    prefix_values=values, prefix_offsets=offsets, hash_id_block_size=block_size, ids_cover_output=True,
                    name=name)
