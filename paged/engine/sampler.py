"""Logits -> token ids: greedy, temperature, top-k, top-p, min_tokens, with per-sequence random state.

Each sequence owns a `torch.Generator`, seeded from its request's `seed` (or from a seed the
engine draws for it) plus its index among the request's `n` parallel samples, as vLLM seeds
them. A sequence's draws therefore depend only on its own history, not on which other requests
shared its batches — so a seeded request is reproducible under any load, and preemption does
not change it.

Sampling itself is the exponential race: argmax(p / E) with E ~ Exp(1) drawn from the
sequence's generator picks token i with probability p_i, with no cumulative sum or search.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from paged import SamplingParams

_GREEDY_BELOW = 1e-5  # vLLM's rule: a temperature this small means greedy


@dataclass(slots=True)
class SampleRow:
    """One token to sample: from logits row `logits_index`, for sequence `index` of request `request_id`."""

    logits_index: int
    request_id: str  # the request the user submitted (the parent of parallel samples)
    index: int
    params: SamplingParams
    # Tokens that may not be sampled: the sequence's EOS and stop ids while it is short of min_tokens.
    banned: frozenset[int] = frozenset()


class Sampler:
    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)  # seeds for requests that bring none
        self._seeds: dict[str, int] = {}
        self._generators: dict[tuple[str, int], torch.Generator] = {}

    def add_request(self, request_id: str, params: SamplingParams) -> None:
        self._seeds[request_id] = params.seed if params.seed is not None else self._rng.getrandbits(62)

    def free_request(self, request_id: str, num_seqs: int) -> None:
        self._seeds.pop(request_id, None)
        for i in range(num_seqs):
            self._generators.pop((request_id, i), None)

    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> list[int]:
        logits = logits[[r.logits_index for r in rows]]  # a copy: masking below changes only it
        vocab = logits.shape[-1]
        for i, r in enumerate(rows):
            if r.banned:
                logits[i, [t for t in r.banned if t < vocab]] = float("-inf")
        temperature = torch.tensor([r.params.temperature for r in rows], device=logits.device)
        greedy = temperature < _GREEDY_BELOW
        tokens = logits.argmax(dim=-1)
        if not greedy.all():
            probs = self._filtered(logits / temperature.clamp(min=_GREEDY_BELOW)[:, None], rows).softmax(dim=-1)
            race = torch.stack([torch.empty_like(probs[0]).exponential_(generator=self._generator(r, probs.device))
                                for r in rows])
            tokens = torch.where(greedy, tokens, (probs / race).argmax(dim=-1))
        return tokens.tolist()

    def _generator(self, row: SampleRow, device: torch.device) -> torch.Generator:
        key = (row.request_id, row.index)
        g = self._generators.get(key)
        if g is None:
            g = self._generators[key] = torch.Generator(device).manual_seed(self._seeds[row.request_id] + row.index)
        return g

    @staticmethod
    def _filtered(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """Top-k, then top-p over what top-k kept (as vLLM), by masking logits to -inf."""
        vocab = logits.shape[-1]
        top_k = [min(r.params.top_k, vocab) or vocab for r in rows]
        top_p = [r.params.top_p for r in rows]
        if min(top_k) == vocab and min(top_p) >= 1.0:
            return logits
        ordered, order = logits.sort(dim=-1, descending=True)
        rank = torch.arange(vocab, device=logits.device)
        drop = rank[None, :] >= torch.tensor(top_k, device=logits.device)[:, None]
        ordered = ordered.masked_fill(drop, float("-inf"))
        probs = ordered.softmax(dim=-1)
        # The smallest head whose mass reaches top_p: a token stays while the mass before it is below
        # top_p, so the first always stays; top_p = 1 drops nothing even where float sums reach 1 early.
        p = torch.tensor(top_p, device=logits.device)[:, None]
        drop = ((probs.cumsum(dim=-1) - probs) >= p) & (p < 1.0)
        ordered = ordered.masked_fill(drop, float("-inf"))
        return torch.empty_like(logits).scatter_(-1, order, ordered)
