"""The allocation API the scheduler calls: `can_allocate` / `allocate` / `free`.

A sequence's allocation is opaque to the scheduler: it asks for room for `num_tokens` tokens in total and gets
back the block table to pass to the engine. How blocks are found (fresh, shared, cached) stays in here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.kv_cache.block_pool import BlockPool


@dataclass
class KVAllocation:
    """The blocks held by one sequence, in token order."""

    block_table: list[int] = field(default_factory=list)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self._allocs: dict[str, KVAllocation] = {}

    def _blocks_needed(self, seq_id: str, num_tokens: int) -> int:
        have = len(self._allocs[seq_id].block_table) if seq_id in self._allocs else 0
        return max(0, -(-num_tokens // self.block_size) - have)

    def can_allocate(self, seq_id: str, num_tokens: int) -> bool:
        """Whether the sequence can grow to hold `num_tokens` tokens in total right now."""
        return self._blocks_needed(seq_id, num_tokens) <= self.pool.num_free

    def allocate(self, seq_id: str, num_tokens: int) -> KVAllocation | None:
        """Grow the sequence's allocation to `num_tokens` tokens; None (and no change) if the pool is short."""
        need = self._blocks_needed(seq_id, num_tokens)
        if need > self.pool.num_free:
            return None
        alloc = self._allocs.setdefault(seq_id, KVAllocation())
        alloc.block_table.extend(self.pool.allocate(need))
        return alloc

    def block_table(self, seq_id: str) -> list[int]:
        alloc = self._allocs.get(seq_id)
        return list(alloc.block_table) if alloc else []

    def free(self, seq_id: str) -> None:
        alloc = self._allocs.pop(seq_id, None)
        if alloc is not None:
            self.pool.free(alloc.block_table)

    @property
    def num_sequences(self) -> int:
        return len(self._allocs)

    @property
    def usage(self) -> float:
        return self.pool.num_used / self.pool.num_blocks
