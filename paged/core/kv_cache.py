"""KVCacheManager: the block tables of all requests over one device pool (and a host pool).

It answers the scheduler's questions — how much of this prompt is cached, is there room for
these tokens — and does the bookkeeping: allocation that says "no room" instead of
over-committing, prefix-cache hits, freeing, fork with copy-on-write, and swap to the host.
Copies and swaps are not performed here: they are returned for the driver, which owns the
memory and applies a step's moves in this order: swap out, swap in, copies, then the forward.

A request whose blocks nobody can share or cache (no content to hash, one sequence: the
simulator's length-only rows) holds them by count (`BlockCount`, blocks lent by the pool as a
number): O(1) per allocation and per free, however many blocks. Its ids exist only once a driver
asks for its table (`block_table`, or a swap-out, whose mapping names blocks).

Within one scheduling step a block freed by one decision may be handed out by the next, so a
block whose content the driver still has to read stays reserved until `end_step`: the source
of a copy-on-write, and host blocks being swapped in. A request preempted in the step that
copied its block gets its shared block back and the copy is dropped, so a swap-out never
reads a copy that has not been made.
"""
from __future__ import annotations

from .block_pool import Block, BlockPool
from .block_table import BlockCount, BlockTable
from .config import CacheConfig
from .hashing import extend_block_hashes
from .request import Request


class KVCacheManager:
    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.block_size = config.block_size
        self.enable_caching = config.enable_prefix_caching
        if config.eviction == "queue" and config.enable_prefix_caching:
            from .queue_aware_pool import QueueAwarePool  # (imported only where used: a run's start pays for imports)

            self.pool = QueueAwarePool(config.num_gpu_blocks)
        else:
            self.pool = BlockPool(config.num_gpu_blocks, config.enable_prefix_caching)
        self.cpu_pool = BlockPool(config.num_cpu_blocks, enable_caching=False) if config.num_cpu_blocks else None
        self.tables: dict[str, BlockTable | BlockCount] = {}
        self.cpu_tables: dict[str, list[Block]] = {}
        self._cow: list[tuple[str, int, Block, Block]] = []  # (request id, index, source, copy) this step
        self._pins: dict[int, int] = {}  # source block id -> references held for copies in flight
        self._cpu_releases: list[Block] = []  # host blocks being swapped in this step
        self.num_table_slots = 0  # slots of all block tables together (fragmentation's denominator)
        # Tables that name their blocks (`BlockTable`); while there are none (a length-only trace),
        # `append_blocks` only counts, without asking each table's class at every block boundary.
        self.num_named_tables = 0
        self.prefix_cache_queries = 0  # tokens looked up, counted once per admission (as vLLM)
        self.prefix_cache_hits = 0

    # -- figures ------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    # -- prefix cache -------------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[Block], int]:
        """Longest cached prefix of the request, in whole blocks, never covering the last token:
        the last token must be computed again to produce the logits of the next one."""
        if not self.enable_caching or not request.has_content:
            return [], 0
        get = self.pool.cached.get
        hits = []
        for h in self._prefix_hashes(request):
            b = get(h)
            if b is None:
                break
            hits.append(b)
        return hits, len(hits) * self.block_size

    def waits(self, request: Request, key: tuple) -> None:
        """A request joined the waiting queue at `key` (a queue-aware pool keeps what its prompt would hit)."""
        if request.has_content:
            self.pool.want(self._prefix_hashes(request), key)

    def stops_waiting(self, request: Request, key: tuple) -> None:
        """The request `waits` was told of left the waiting queue."""
        if request.has_content:
            self.pool.unwant(self._prefix_hashes(request), key)

    def _prefix_hashes(self, request: Request) -> list:
        """The hashes of the blocks a prefix hit may cover (`get_computed_blocks`): every full block but
        one holding the last token. Fixed while the request waits (it has no tokens to add then)."""
        n = (request.num_tokens - 1) // self.block_size
        return extend_block_hashes(request, self.block_size, n)[:n]

    def record_prefix_query(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_cache_queries += num_query_tokens
        self.prefix_cache_hits += num_hit_tokens

    def cache_full_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the request's newly filled blocks in the prefix cache."""
        if not self.enable_caching or not request.has_content:
            return
        table = self.tables[request.request_id]
        num_full = num_computed_tokens // self.block_size
        if num_full <= table.num_cached_blocks:
            return
        hashes = extend_block_hashes(request, self.block_size, num_full)
        start, end = table.num_cached_blocks, min(num_full, len(hashes))
        self.pool.cache(table.blocks[start:end], hashes[start:end])
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
        return not self.try_allocate_slots(request, num_new_tokens, computed_blocks, reserve)

    def try_allocate_slots(self, request: Request, num_new_tokens: int, computed_blocks: list[Block] = (),
                           reserve: int = 0) -> int:
        """`allocate_slots`, saying what it lacks: 0 when done, else how many more free blocks it
        would need (changing nothing), so that a failed admission is planned once, not twice."""
        rid = request.request_id
        table = self.tables.get(rid)
        start, num_new_blocks, cow, from_free = self._plan(request, table, num_new_tokens, computed_blocks)
        pool = self.pool
        short = from_free + reserve - pool.num_free_blocks
        if short > 0:
            return short
        bs = self.block_size
        if table is None:
            if not request.has_content and request.sampling_params.n == 1:
                table = self.tables[rid] = BlockCount(bs)
            else:
                table = self.tables[rid] = BlockTable(bs)
                self.num_named_tables += 1
        if table.__class__ is BlockCount:
            if num_new_blocks:
                pool.lend(num_new_blocks)
                table.num_blocks += num_new_blocks
                self.num_table_slots += num_new_blocks * bs
            return 0
        if computed_blocks:
            pool.touch(computed_blocks)
            table.extend(computed_blocks)
        if cow:
            i = start // bs
            old = table.blocks[i]
            new = pool.allocate()
            table.replace(i, new)
            self._cow.append((rid, i, old, new))  # `old` keeps this table's reference until end_step
            self._pins[old.block_id] = self._pins.get(old.block_id, 0) + 1
        if num_new_blocks:
            table.extend(pool.allocate_n(num_new_blocks))
        self.num_table_slots += (len(computed_blocks) + num_new_blocks) * bs
        return 0

    def free_blocks_needed(self, request: Request, num_new_tokens: int, computed_blocks: list[Block] = ()) -> int:
        """The free blocks `allocate_slots` would take now (it allocates nothing)."""
        return self._plan(request, self.tables.get(request.request_id), num_new_tokens, computed_blocks)[3]

    def _plan(self, request: Request, table: BlockTable | None, num_new_tokens: int,
              computed_blocks) -> tuple[int, int, bool, int]:
        """For an allocation to the request's `table`: (the first token written, new blocks, whether
        the block it lands in must be copied first, blocks taken from the free lists, cached hits
        on free blocks included). Only a request outside the decode batch is planned (admitted,
        prefilling, swapped in; a decode member's blocks come from `append_block`): its computed
        tokens are its own count, read without the property (tens of thousands of plans a run)."""
        if request.decode_batch is not None:
            raise ValueError(f"request {request.request_id}: an allocation planned while it decodes; expected "
                             "append_block for a decode member's blocks")
        bs = self.block_size
        start = request.num_computed_base + len(computed_blocks) * bs
        # A partly filled block being written lives in the table (prefix hits are whole blocks).
        # References held only for copies in flight do not count: copies run before the forward.
        # (A table's size read off its fields: len() of a table is a Python call made from C.)
        if table is None:
            have, cow = len(computed_blocks), False
        elif table.__class__ is BlockCount:  # nobody shares its blocks: never a copy
            have, cow = table.num_blocks + len(computed_blocks), False
        else:
            have = len(table.blocks) + len(computed_blocks)
            if start % bs:
                b = table.blocks[start // bs]
                cow = b.ref_cnt - self._pins.get(b.block_id, 0) > 1
            else:
                cow = False
        num_new_blocks = -(-(start + num_new_tokens) // bs) - have
        if num_new_blocks < 0:
            num_new_blocks = 0
        from_free = num_new_blocks + cow
        if computed_blocks:
            from_free += sum(b.ref_cnt == 0 for b in computed_blocks)
        return start, num_new_blocks, cow, from_free

    def num_exclusive_blocks(self, request: Request) -> int:
        """Device blocks only this request holds: what preempting it frees."""
        table = self.tables.get(request.request_id)
        if table is None:
            return 0
        return sum(b.ref_cnt == 1 for b in table.blocks) if table.__class__ is BlockTable else table.num_blocks

    def append_block(self, request: Request) -> bool:
        """One more block for a decoding request crossing into a new block (the hot path)."""
        table = self.tables[request.request_id]
        if table.__class__ is BlockCount:
            if not self.pool.num_free_blocks:
                return False
            self.pool.lend(1)
            table.num_blocks += 1
        else:
            block = self.pool.allocate()
            if block is None:
                return False
            table.append(block)
        self.num_table_slots += self.block_size
        return True

    def append_blocks(self, steps) -> bool:
        """`append_block` for each request of each step in `steps` (collections of requests, in
        order), in one go; False, changing nothing, when the plain free blocks do not cover them
        all (an eviction, or an empty pool, is then met one block at a time by the caller). A
        window of decode steps passes one collection per step: no flat list of its crossings."""
        pool, tables = self.pool, self.tables
        n = 0
        for requests in steps:
            n += len(requests)
        if not pool.lend_plain(n):
            return False
        if not self.num_named_tables:  # every table counts its blocks: one add per crossing (the hot loop)
            for requests in steps:
                for req in requests:
                    tables[req.request_id].num_blocks += 1
        else:
            owned = []  # tables that hold particular blocks: theirs come off the lent ones
            for requests in steps:
                for req in requests:
                    table = tables[req.request_id]
                    if table.__class__ is BlockCount:
                        table.num_blocks += 1
                    else:
                        owned.append(table)
            if owned:
                for table, block in zip(owned, pool.materialize(len(owned))):
                    table.blocks.append(block)
        self.num_table_slots += n * self.block_size
        return True

    def undo_copy_on_write(self, request: Request) -> None:
        """A request preempted in the step that copied its block takes its shared block back."""
        rid = request.request_id
        if not any(c[0] == rid for c in self._cow):
            return
        keep = []
        for entry in self._cow:
            if entry[0] != rid:
                keep.append(entry)
                continue
            _, i, old, new = entry
            self.tables[rid].replace(i, old)  # the reference held for the copy is the table's again
            self._pins[old.block_id] -= 1
            self.pool.free((new,))
        self._cow = keep

    def trim(self, request: Request, num_tokens: int) -> None:
        """Drop blocks past the first `num_tokens` (allocated in this step for work that will not
        run), so a table never holds more than its tokens need."""
        table = self.tables.get(request.request_id)
        keep = -(-num_tokens // self.block_size)
        if table is not None and len(table) > keep:
            self.num_table_slots -= (len(table) - keep) * self.block_size
            if table.__class__ is BlockCount:
                self.pool.give_back(table.num_blocks - keep)
                table.num_blocks = keep
            else:
                self.pool.free(reversed(table.truncate(keep)))

    def free(self, request: Request) -> None:
        """Release the request's device blocks, tail first (the end of a prefix evicts first)."""
        table = self.tables.pop(request.request_id, None)
        if table is not None:
            if table.__class__ is BlockCount:  # (its slots without the num_slots property: a free per request)
                self.num_table_slots -= table.num_blocks * self.block_size
                self.pool.give_back(table.num_blocks)
            else:
                self.num_table_slots -= table.num_slots
                self.pool.free(reversed(table.blocks))
                self.num_named_tables -= 1
        cpu = self.cpu_tables.pop(request.request_id, None)
        if cpu is not None:
            self.cpu_pool.free(reversed(cpu))

    def fork(self, parent: Request, child: Request) -> None:
        """The child shares every block of the parent; the first write into a shared partly
        filled block copies it (see `allocate_slots`)."""
        table = self.tables[parent.request_id]
        self.pool.touch(table.blocks)
        child_table = self.tables[child.request_id] = BlockTable(self.block_size, table.blocks)
        self.num_named_tables += 1
        child_table.num_cached_blocks = table.num_cached_blocks
        self.num_table_slots += table.num_slots
        num_full = parent.num_computed_tokens // self.block_size
        child.block_hashes = list(parent.block_hashes[:num_full])

    def last_block_shared(self, request: Request) -> bool:
        """Whether the request's next token would be written into a block someone else holds."""
        table = self.tables.get(request.request_id)
        if table.__class__ is not BlockTable or not table.blocks:  # none, or held by count: nobody shares it
            return False
        pos = request.num_computed_tokens
        return pos % self.block_size != 0 and table.blocks[pos // self.block_size].ref_cnt > 1

    # -- swap ---------------------------------------------------------------------------------
    def swap_out(self, request: Request) -> list[tuple[int, int]] | None:
        """Move the request's blocks to the host pool; None when the host pool has no room."""
        table = self.tables.get(request.request_id)
        cpu_pool = self.cpu_pool
        if table is None or cpu_pool is None or cpu_pool.num_free_blocks < len(table):
            return None
        table = self.block_table(request)  # the mapping names the blocks
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
        self._cpu_releases.extend(reversed(cpu_blocks))  # the driver reads them this step
        self.tables[request.request_id] = BlockTable(self.block_size, gpu_blocks)
        self.num_named_tables += 1
        self.num_table_slots += len(gpu_blocks) * self.block_size
        return mapping

    def num_swapped_blocks(self, request: Request) -> int:
        return len(self.cpu_tables[request.request_id])

    # -- page table ---------------------------------------------------------------------------
    def block_table(self, request: Request) -> BlockTable:
        """The request's table with its block ids; a table held by count gets its blocks named now."""
        rid = request.request_id
        table = self.tables[rid]
        if table.__class__ is BlockCount:
            table = self.tables[rid] = BlockTable(self.block_size, self.pool.materialize(table.num_blocks))
            self.num_named_tables += 1
        return table

    def lookup(self, request: Request, token_idx: int) -> tuple[int, int]:
        return self.block_table(request).lookup(token_idx)

    def slot_mapping(self, request: Request, start: int, end: int) -> list[int]:
        return self.block_table(request).slot_mapping(start, end)

    def end_step(self) -> list[tuple[int, int]]:
        """The step's block copies (source, destination), for the driver; the blocks it still had
        to read become free to use from the next step on."""
        if not self._cow and not self._cpu_releases:  # most steps
            return []
        copies = [(old.block_id, new.block_id) for _, _, old, new in self._cow]
        if self._cow:
            self.pool.free([old for _, _, old, _ in self._cow])
            self._cow = []
            self._pins.clear()
        if self._cpu_releases:
            self.cpu_pool.free(self._cpu_releases)
            self._cpu_releases = []
        return copies

    def reset_prefix_cache(self) -> None:
        self.pool.reset_prefix_cache()
        for table in self.tables.values():
            if table.__class__ is BlockTable:
                table.num_cached_blocks = 0
