"""The page table of one sequence: logical token positions -> physical KV slots.

It keeps the `Block` objects (for reference counting). Their plain ids, which a driver ships
to the attention kernel every step, are listed lazily and extended as the table grows: the
simulator never asks for them, and the engine asks every step for a table that has grown by a
block at most.
"""
from __future__ import annotations

from .block_pool import Block


class BlockTable:
    __slots__ = ("blocks", "_ids", "block_size", "num_cached_blocks")

    def __init__(self, block_size: int, blocks: list[Block] | None = None) -> None:
        self.block_size = block_size
        self.blocks: list[Block] = list(blocks or ())
        self._ids: list[int] = []  # ids of blocks[:len(_ids)]
        self.num_cached_blocks = 0  # leading blocks already registered in the prefix cache

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def num_slots(self) -> int:
        return len(self.blocks) * self.block_size

    @property
    def block_ids(self) -> list[int]:
        ids, blocks = self._ids, self.blocks
        if len(ids) < len(blocks):
            ids.extend([b.block_id for b in blocks[len(ids):]])
        return ids

    def append(self, block: Block) -> None:
        self.blocks.append(block)

    def extend(self, blocks: list[Block]) -> None:
        self.blocks.extend(blocks)

    def replace(self, index: int, block: Block) -> None:
        self.blocks[index] = block
        if index < len(self._ids):
            self._ids[index] = block.block_id

    def truncate(self, num_blocks: int) -> list[Block]:
        """Drop the blocks past the first `num_blocks`; returns them."""
        dropped = self.blocks[num_blocks:]
        del self.blocks[num_blocks:], self._ids[num_blocks:]
        return dropped

    def lookup(self, token_idx: int) -> tuple[int, int]:
        """(block_id, offset) of the KV slot that holds token `token_idx`."""
        i, offset = divmod(token_idx, self.block_size)
        if token_idx < 0 or i >= len(self.blocks):
            raise IndexError(f"token index {token_idx} outside the block table "
                             f"({len(self.blocks)} blocks of {self.block_size} tokens)")
        return self.blocks[i].block_id, offset

    def slot_mapping(self, start: int, end: int) -> list[int]:
        """Physical slots of tokens start..end-1, in the flat `block_id * block_size + offset` form."""
        if start < 0 or end > self.num_slots or start > end:
            raise IndexError(f"slot range [{start}, {end}) outside the block table ({self.num_slots} slots)")
        bs, ids = self.block_size, self.block_ids
        return [ids[t // bs] * bs + t % bs for t in range(start, end)]


class BlockCount:
    """The table of a request whose blocks nobody can share or cache (no content to hash, one
    sequence): only how many blocks it holds, lent by count (`BlockPool.lend`), so that its
    allocations and its free cost O(1) however long its prompt. The simulator's length-only
    requests live here; `KVCacheManager.block_table` turns one into a `BlockTable` when a
    driver asks for ids."""

    __slots__ = ("num_blocks", "block_size")

    blocks = ()  # no named blocks: a walk over every table's blocks (a reference-count audit) sees none

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.num_blocks = 0

    def __len__(self) -> int:
        return self.num_blocks

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size
