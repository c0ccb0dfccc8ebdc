"""The allocation API the scheduler calls: `admit` / `allocate` / `commit` / `free`.

A sequence's allocation is opaque to the scheduler: it asks for room for `num_tokens` tokens in total and passes
the block table on to the engine. How blocks are found -- fresh, or shared with an earlier request that had the
same prefix (prefix caching) -- stays in here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.kv_cache.block_pool import BlockPool
from gateway.kv_cache.prefix_cache import ROOT_HASH, block_hash, prefix_hashes


@dataclass
class KVAllocation:
    """The blocks held by one sequence, in token order, and the hashes of its leading full blocks."""

    block_table: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)


@dataclass
class PrefixCacheStats:
    queried_tokens: int = 0
    hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.enable_prefix_caching = enable_prefix_caching
        self.prefix_stats = PrefixCacheStats()
        self._allocs: dict[str, KVAllocation] = {}

    def admit(self, seq_id: str, tokens: list[int]) -> int:
        """Start a sequence: reuse cached blocks of its longest cached prefix; return how many tokens they hold.

        At least one token is always left to compute, so the step that finishes the prompt yields logits.
        """
        alloc = self._allocs.setdefault(seq_id, KVAllocation())
        if not self.enable_prefix_caching or alloc.block_table:
            return 0
        self.prefix_stats.queried_tokens += len(tokens)
        for h in prefix_hashes(tokens, self.block_size, (len(tokens) - 1) // self.block_size):
            block = self.pool.lookup(h)
            if block is None:
                break
            self.pool.touch(block)
            alloc.block_table.append(block)
            alloc.hashes.append(h)
        cached = len(alloc.block_table) * self.block_size
        self.prefix_stats.hit_tokens += cached
        return cached

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

    def commit(self, seq_id: str, tokens: list[int], num_computed: int) -> None:
        """Register the sequence's blocks that became full, so later requests with the same prefix reuse them."""
        alloc = self._allocs.get(seq_id)
        if alloc is None or not self.enable_prefix_caching:
            return
        bs = self.block_size
        for i in range(len(alloc.hashes), num_computed // bs):
            parent = alloc.hashes[-1] if alloc.hashes else ROOT_HASH
            h = block_hash(parent, tokens[i * bs : (i + 1) * bs])
            alloc.hashes.append(h)
            self.pool.register(alloc.block_table[i], h)

    def cached_blocks(self, seq_id: str) -> list[int]:
        """The sequence's full, registered blocks (what a session pins to keep a conversation warm)."""
        alloc = self._allocs.get(seq_id)
        return list(alloc.block_table[: len(alloc.hashes)]) if alloc else []

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
