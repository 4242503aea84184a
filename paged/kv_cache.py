"""KVCacheManager: the block tables of all requests over one device pool (and a host pool).

It answers the scheduler's questions — how much of this prompt is cached, is there room for
these tokens — and does the bookkeeping: allocation that says "no room" instead of
over-committing, prefix-cache hits, freeing, fork with copy-on-write, and swap to the host.
Copies and swaps are not performed here: they are returned (or queued in `pending_copies`)
for the driver, which owns the memory.
"""
from __future__ import annotations

from .block_pool import Block, BlockPool
from .block_table import BlockTable
from .config import CacheConfig
from .hashing import extend_block_hashes
from .request import Request


class KVCacheManager:
    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self.enable_caching = config.enable_prefix_caching
        self.pool = BlockPool(config.num_gpu_blocks, config.enable_prefix_caching)
        self.cpu_pool = BlockPool(config.num_cpu_blocks, enable_caching=False) if config.num_cpu_blocks else None
        self.tables: dict[str, BlockTable] = {}
        self.cpu_tables: dict[str, list[Block]] = {}
        self.pending_copies: list[tuple[int, int]] = []
        self.num_table_slots = 0  # slots of all block tables together (fragmentation's denominator)
        self.prefix_cache_queries = 0  # tokens looked up, counted once per admission (as vLLM)
        self.prefix_cache_hits = 0

    # -- figures ------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    def num_blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache -------------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[Block], int]:
        """Longest cached prefix of the request, in whole blocks, never covering the last token:
        the last token must be computed again to produce the logits of the next one."""
        if not self.enable_caching:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = extend_block_hashes(request, self.block_size, max_blocks)
        get = self.pool.cached.get
        hits = []
        for h in hashes[:max_blocks]:
            b = get(h)
            if b is None:
                break
            hits.append(b)
        return hits, len(hits) * self.block_size

    def record_prefix_query(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_cache_queries += num_query_tokens
        self.prefix_cache_hits += num_hit_tokens

    def cache_full_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the request's newly filled blocks in the prefix cache."""
        if not self.enable_caching:
            return
        table = self.tables[request.request_id]
        num_full = num_computed_tokens // self.block_size
        if num_full <= table.num_cached_blocks:
            return
        hashes = extend_block_hashes(request, self.block_size, num_full)
        cache = self.pool.cache
        for i in range(table.num_cached_blocks, min(num_full, len(hashes))):
            cache(table.blocks[i], hashes[i])
        # Blocks whose content is unknown (a length-only trace) are never cached: skip them for good.
        table.num_cached_blocks = num_full

    # -- allocation ---------------------------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int, computed_blocks: list[Block] = (),
                       reserve: int = 0) -> bool:
        """Make room for `num_new_tokens` after the request's computed tokens (and its new
        prefix hits); False, changing nothing, when that would leave fewer than `reserve` free.

        If the first token to be written lands in a partly filled block that another request
        also holds (after a fork), that block is copied first (copy-on-write).
        """
        rid = request.request_id
        table = self.tables.get(rid)
        if table is None:
            table = self.tables[rid] = BlockTable(self.block_size)
        bs = self.block_size
        start = request.num_computed_tokens + len(computed_blocks) * bs
        have = len(table) + len(computed_blocks)
        num_new_blocks = max(0, -(-(start + num_new_tokens) // bs) - have)
        from_free = num_new_blocks + sum(1 for b in computed_blocks if b.ref_cnt == 0)
        cow = start % bs != 0 and table.blocks[start // bs].ref_cnt > 1 if have else False
        if from_free + cow + reserve > self.pool.num_free_blocks:
            if not table.blocks:
                del self.tables[rid]
            return False
        pool = self.pool
        if computed_blocks:
            pool.touch(computed_blocks)
            table.extend(computed_blocks)
        if cow:
            i = start // bs
            old = table.blocks[i]
            new = pool.allocate()
            self.pending_copies.append((old.block_id, new.block_id))
            table.replace(i, new)
            pool.free((old,))
        if num_new_blocks:
            table.extend(pool.allocate_n(num_new_blocks))
        self.num_table_slots += (len(computed_blocks) + num_new_blocks) * bs
        return True

    def append_block(self, request: Request) -> bool:
        """One more block for a decoding request crossing into a new block (the hot path)."""
        pool = self.pool
        if not pool.num_free_blocks:
            return False
        self.tables[request.request_id].append(pool.allocate())
        self.num_table_slots += self.block_size
        return True

    def free(self, request: Request) -> None:
        """Release the request's device blocks, tail first (the end of a prefix evicts first)."""
        table = self.tables.pop(request.request_id, None)
        if table is not None:
            self.num_table_slots -= table.num_slots
            self.pool.free(reversed(table.blocks))
        cpu = self.cpu_tables.pop(request.request_id, None)
        if cpu is not None:
            self.cpu_pool.free(reversed(cpu))

    def fork(self, parent: Request, child: Request) -> None:
        """The child shares every block of the parent; the first write into a shared partly
        filled block copies it (see `allocate_slots`)."""
        table = self.tables[parent.request_id]
        self.pool.touch(table.blocks)
        child_table = self.tables[child.request_id] = BlockTable(self.block_size, table.blocks)
        child_table.num_cached_blocks = table.num_cached_blocks
        self.num_table_slots += table.num_slots
        num_full = parent.num_computed_tokens // self.block_size
        child.block_hashes = list(parent.block_hashes[:num_full])

    def last_block_shared(self, request: Request) -> bool:
        """Whether the request's next token would be written into a block someone else holds."""
        table = self.tables.get(request.request_id)
        pos = request.num_computed_tokens
        return bool(table) and pos % self.block_size != 0 and table.blocks[pos // self.block_size].ref_cnt > 1

    # -- swap ---------------------------------------------------------------------------------
    def swap_out(self, request: Request) -> list[tuple[int, int]] | None:
        """Move the request's blocks to the host pool; None when the host pool has no room."""
        table = self.tables.get(request.request_id)
        cpu_pool = self.cpu_pool
        if table is None or cpu_pool is None or cpu_pool.num_free_blocks < len(table):
            return None
        cpu_blocks = cpu_pool.allocate_n(len(table))
        mapping = [(g.block_id, c.block_id) for g, c in zip(table.blocks, cpu_blocks, strict=True)]
        self.free(request)
        self.cpu_tables[request.request_id] = cpu_blocks
        return mapping

    def swap_in(self, request: Request, reserve: int = 0) -> list[tuple[int, int]] | None:
        """Bring a swapped request back; None when the device pool lacks room (plus `reserve`)."""
        cpu_blocks = self.cpu_tables[request.request_id]
        if len(cpu_blocks) + reserve > self.pool.num_free_blocks:
            return None
        gpu_blocks = self.pool.allocate_n(len(cpu_blocks))
        mapping = [(c.block_id, g.block_id) for c, g in zip(cpu_blocks, gpu_blocks, strict=True)]
        del self.cpu_tables[request.request_id]
        self.cpu_pool.free(reversed(cpu_blocks))
        self.tables[request.request_id] = BlockTable(self.block_size, gpu_blocks)
        self.num_table_slots += len(gpu_blocks) * self.block_size
        return mapping

    def num_swapped_blocks(self, request: Request) -> int:
        return len(self.cpu_tables[request.request_id])

    # -- page table ---------------------------------------------------------------------------
    def block_table(self, request: Request) -> BlockTable:
        return self.tables[request.request_id]

    def lookup(self, request: Request, token_idx: int) -> tuple[int, int]:
        return self.tables[request.request_id].lookup(token_idx)

    def slot_mapping(self, request: Request, start: int, end: int) -> list[int]:
        return self.tables[request.request_id].slot_mapping(start, end)

    def take_pending_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def reset_prefix_cache(self) -> None:
        self.pool.reset_prefix_cache()
        for table in self.tables.values():
            table.num_cached_blocks = 0
