"""The allocation API the scheduler calls: `admit` / `allocate` / `commit` / `free`.

A sequence's allocation is opaque to the scheduler: it asks for room for `num_tokens` tokens in total and passes
the block table on to the engine. How blocks are found -- fresh, or shared with an earlier request that had the
same prefix (prefix caching) -- stays in here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.kv_cache import prefix_cache
from gateway.kv_cache.block_pool import BlockPool


@dataclass
class KVAllocation:
    """The blocks held by one sequence, in token order; the digests of its leading full blocks (computed once,
    possibly ahead of the blocks), and how many of those blocks are committed (computed and offered to the cache)."""

    block_table: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    num_committed: int = 0
    root: bytes = prefix_cache.ROOT_HASH  # where its chain of digests starts (a LoRA adapter's own: root_hash)


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

    def hashes(
        self, tokens: Sequence[int], known: list[bytes], num_blocks: int, root: bytes = prefix_cache.ROOT_HASH
    ) -> list[bytes]:
        """The digests of the first `num_blocks` full blocks of `tokens`, extending `known` (a sequence's own
        list, kept across steps and preemptions: its tokens only grow) in place; `root`: the sequence's chain start
        (prefix_cache.root_hash: one per LoRA adapter, so adapters never share blocks)."""
        return prefix_cache.extend_hashes(known, tokens, self.block_size, num_blocks, root)

    def _find(self, tokens: Sequence[int], hashes: list[bytes], i: int) -> int | None:
        bs = self.block_size
        return self.pool.lookup(hashes[i], tokens[i * bs : (i + 1) * bs])

    def num_cached_blocks(
        self, tokens: Sequence[int], hashes: list[bytes] | None = None, root: bytes = prefix_cache.ROOT_HASH
    ) -> int:
        """How many leading blocks of `tokens` `admit` would find in the cache now (no reference is taken)."""
        if not self.enable_prefix_caching:
            return 0
        n = (len(tokens) - 1) // self.block_size
        hashes = self.hashes(tokens, [] if hashes is None else hashes, n, root)
        k = 0
        while k < n and self._find(tokens, hashes, k) is not None:
            k += 1
        return k

    def admit(
        self, seq_id: str, tokens: list[int], hashes: list[bytes] | None = None, root: bytes = prefix_cache.ROOT_HASH
    ) -> int:
        """Start a sequence: reuse cached blocks of its longest cached prefix; return how many tokens they hold.
        `hashes`: the sequence's digest list, if it keeps one (see `hashes`); `root`: its chain start.

        At least one token is always left to compute, so the step that finishes the prompt yields logits.
        """
        alloc = self._allocs.setdefault(seq_id, KVAllocation())
        alloc.root = root
        if hashes is not None:
            alloc.hashes = hashes
        if not self.enable_prefix_caching or alloc.block_table:
            return 0
        self.prefix_stats.queried_tokens += len(tokens)
        n = (len(tokens) - 1) // self.block_size
        self.hashes(tokens, alloc.hashes, n, root)
        for i in range(n):
            block = self._find(tokens, alloc.hashes, i)
            if block is None:
                break
            self.pool.touch(block)
            alloc.block_table.append(block)
        alloc.num_committed = len(alloc.block_table)
        cached = len(alloc.block_table) * self.block_size
        self.prefix_stats.hit_tokens += cached
        return cached

    def share(self, seq_id: str, blocks: list[int]) -> int:
        """Append `blocks` after an admitted sequence's cached prefix, taking a reference to each: full blocks of its
        prefix that another sequence's prefill writes in the step being planned (a follower admitted in the step
        that completes a shared prefix). They count as committed here: their writer registers them in the cache
        when that step is done. Returns the tokens they hold."""
        alloc = self._allocs[seq_id]
        for block in blocks:
            self.pool.touch(block)
        alloc.block_table.extend(blocks)
        alloc.num_committed = len(alloc.block_table)
        shared = len(blocks) * self.block_size
        self.prefix_stats.hit_tokens += shared
        return shared

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
        n = num_computed // bs
        if n <= alloc.num_committed:
            return
        self.hashes(tokens, alloc.hashes, n, alloc.root)
        for i in range(alloc.num_committed, n):
            # Refused when another block holds the same prefix already (two sequences computed it at once): the
            # cache keeps that one, and `cached_blocks` names it instead of this duplicate.
            self.pool.register(alloc.block_table[i], alloc.hashes[i], tokens[i * bs : (i + 1) * bs])
        alloc.num_committed = n

    def truncate(self, seq_id: str, num_tokens: int) -> None:
        """Shrink the sequence's allocation to the blocks that hold its first `num_tokens` tokens: speculative
        tokens that were rejected leave their keys and values in blocks past the accepted length, which go back to
        the pool. Committed blocks (all of whose tokens were accepted) are kept; the rest were never registered,
        so the prefix cache never hands out a block holding a rejected token."""
        alloc = self._allocs.get(seq_id)
        if alloc is None:
            return
        keep = max(-(-num_tokens // self.block_size), alloc.num_committed)
        if keep < len(alloc.block_table):
            self.pool.free(alloc.block_table[keep:])
            del alloc.block_table[keep:]

    def cached_blocks(self, seq_id: str, tokens: Sequence[int]) -> list[int]:
        """The blocks a later lookup of this sequence's `tokens` finds, leading full blocks in order: what a session
        pins to keep a conversation warm. Where the cache holds another block with the same prefix (a duplicate
        computed at the same time), that block is named, not this sequence's copy, which no lookup would find."""
        alloc = self._allocs.get(seq_id)
        if alloc is None or not self.enable_prefix_caching:
            return []
        bs = self.block_size
        found = []
        for i in range(alloc.num_committed):
            block = self._find(tokens, alloc.hashes, i)
            if block is None:  # the cached copy was evicted since: this sequence's own block takes its place
                own = alloc.block_table[i]
                if not self.pool.register(own, alloc.hashes[i], tokens[i * bs : (i + 1) * bs]):
                    break
                block = own
            found.append(block)
        return found

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
