"""Token-id prompts of a workload's lengths, for replaying a trace against a real server.

A request's prompt is its prefix ids' token blocks, then tokens of its own. Each prefix id
(a Mooncake `hash_id`, or a shared-prefix group's id) stands for a fixed block of
`hash_id_block_size` tokens drawn from a generator seeded by (seed, id), so requests that share
leading ids share real leading tokens, which a server's prefix cache can hit, and every run with
the same seed sends the same prompts. The rest of a prompt is drawn from a generator seeded by
(seed, request index). Token ids lie in [min_token_id, vocab_size): above the low ids where
vocabularies keep their special tokens, below the model's vocabulary size.
"""
from __future__ import annotations

import numpy as np

from paged.workloads.workload import Workload

_PREFIX, _OWN = 0, 1  # the two kinds of seeds


class PromptMaker:
    def __init__(self, workload: Workload, vocab_size: int, min_token_id: int, seed: int = 0) -> None:
        if not 0 <= min_token_id < vocab_size:
            raise ValueError(f"token ids in [{min_token_id}, {vocab_size}): expected 0 <= --min-token-id < "
                             "--vocab-size")
        self.workload, self.low, self.high, self.seed = workload, min_token_id, vocab_size, seed
        self._blocks: dict[int, np.ndarray] = {}

    def _draw(self, kind: int, key: int, n: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, kind, key % 2**64])
        return rng.integers(self.low, self.high, n, dtype=np.int64)

    def _block(self, hash_id: int) -> np.ndarray:
        block = self._blocks.get(hash_id)
        if block is None:
            block = self._blocks[hash_id] = self._draw(_PREFIX, hash_id, self.workload.hash_id_block_size)
        return block

    def __call__(self, i: int) -> list[int]:
        n = int(self.workload.num_prompt_tokens[i])
        parts, have = [], 0
        for hash_id in self.workload.prefix_ids(i) or ():
            if have >= n:
                break
            parts.append(self._block(hash_id)[:n - have])
            have += len(parts[-1])
        if have < n:
            parts.append(self._draw(_OWN, i, n - have))
        return np.concatenate(parts).tolist()
