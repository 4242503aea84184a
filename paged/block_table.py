"""The page table of one sequence: logical token positions -> physical KV slots.

It keeps the `Block` objects (for reference counting) and, beside them, their plain ids, which
is what a driver ships to the attention kernel every step; keeping both avoids rebuilding the
id list per step.
"""
from __future__ import annotations

from .block_pool import Block


class BlockTable:
    __slots__ = ("blocks", "block_ids", "block_size", "num_cached_blocks")

    def __init__(self, block_size: int, blocks: list[Block] | None = None) -> None:
        self.block_size = block_size
        self.blocks: list[Block] = list(blocks or ())
        self.block_ids: list[int] = [b.block_id for b in self.blocks]
        self.num_cached_blocks = 0  # leading blocks already registered in the prefix cache

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def num_slots(self) -> int:
        return len(self.blocks) * self.block_size

    def append(self, block: Block) -> None:
        self.blocks.append(block)
        self.block_ids.append(block.block_id)

    def extend(self, blocks: list[Block]) -> None:
        self.blocks.extend(blocks)
        self.block_ids.extend([b.block_id for b in blocks])

    def replace(self, index: int, block: Block) -> None:
        self.blocks[index] = block
        self.block_ids[index] = block.block_id

    def lookup(self, token_idx: int) -> tuple[int, int]:
        """(block_id, offset) of the KV slot that holds token `token_idx`."""
        i, offset = divmod(token_idx, self.block_size)
        if token_idx < 0 or i >= len(self.block_ids):
            raise IndexError(f"token index {token_idx} outside the block table "
                             f"({len(self.block_ids)} blocks of {self.block_size} tokens)")
        return self.block_ids[i], offset

    def slot(self, token_idx: int) -> int:
        block_id, offset = self.lookup(token_idx)
        return block_id * self.block_size + offset

    def slot_mapping(self, start: int, end: int) -> list[int]:
        """Physical slots of tokens start..end-1, in the flat `block_id * block_size + offset` form."""
        if start < 0 or end > self.num_slots or start > end:
            raise IndexError(f"slot range [{start}, {end}) outside the block table ({self.num_slots} slots)")
        bs, ids = self.block_size, self.block_ids
        return [ids[t // bs] * bs + t % bs for t in range(start, end)]
