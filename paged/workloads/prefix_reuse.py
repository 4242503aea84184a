"""The yardstick of cache-aware routing: the prefix hit rate one LRU cache as large as all the
replicas' caches together would reach on a workload, in arrival order.

A router spreads requests over replicas, each with its own cache; no routing can do much better
than one cache that holds everything all of them hold, and sees every request. The model is the
simulator's: blocks of `block_size` tokens named as the replicas name them
(`paged.core.hashing.id_block_hashes`), a hit is the leading run of a prompt's blocks in the
cache (never its last token), and a request's blocks are inserted as it arrives, tail first, so
that its start is the most recently used (the replicas free tail first). Like the replicas, it
caches every full block of a request, its answer's too: blocks past what its ids name are its
own (`paged.core.hashing.own_block_hashes`), so they take room and hit nothing. It is an
idealisation: no block is pinned by a running request.
"""
from __future__ import annotations

from collections import OrderedDict

from paged.core.hashing import id_block_hashes

from .workload import Workload


def pooled_lru_hit_rate(workload: Workload, capacity_blocks: int, block_size: int = 16) -> float:
    """The share of prompt tokens hit by one LRU cache of `capacity_blocks` blocks."""
    lru: OrderedDict[bytes | tuple[int, int], None] = OrderedDict()
    hit = 0
    id_size = workload.hash_id_block_size
    out = workload.num_output_tokens
    for i in range(len(workload)):
        ids = workload.prefix_ids(i)
        if not ids:
            continue
        p = int(workload.num_prompt_tokens[i])
        tokens = p + int(out[i])
        named = min(tokens if workload.ids_cover_output else p, len(ids) * id_size) // block_size
        hashes = id_block_hashes(ids, id_size, block_size, named)
        run = 0
        for h in hashes[:(p - 1) // block_size]:
            if h not in lru:
                break
            run += 1
        hit += run * block_size
        for k in range(tokens // block_size - 1, named - 1, -1):  # its own blocks, tail first
            lru[(i, k)] = None
        for h in reversed(hashes):
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > capacity_blocks:
            lru.popitem(last=False)
    total = int(workload.num_prompt_tokens.sum())
    return hit / total if total else 0.0
