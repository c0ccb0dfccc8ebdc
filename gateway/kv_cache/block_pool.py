"""A fixed pool of KV blocks with reference counts and a cache of full blocks by content hash.

The engine owns the memory (`num_blocks * block_size` slots per layer); this pool only hands out block ids.
A full block can be registered under the digest of its token prefix, with its own tokens. When nobody references
it any more it is not wiped: it stays findable, in least-recently-used order, until a fresh allocation needs the
space. That is all prefix caching needs; sharing comes from the reference counts. A lookup hands out a block only
if its tokens are the asker's too, so even a digest collision cannot serve another prompt's keys and values.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("a KV block pool needs at least one block")
        self.num_blocks = num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))  # LRU first
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, bytes] = {}  # block -> content digest (registered full blocks only)
        self._by_hash: dict[bytes, int] = {}  # content digest -> block
        self._tokens_of: dict[int, tuple[int, ...]] = {}  # registered block -> its own tokens, checked on a hit

    @property
    def num_free(self) -> int:
        """Blocks with no reference (empty or cached-but-evictable)."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._by_hash)

    def allocate(self, count: int) -> list[int]:
        """Take `count` unreferenced blocks, evicting the least recently used cached ones."""
        if count > len(self._free):
            raise RuntimeError(f"asked for {count} KV blocks, {len(self._free)} free")
        blocks = []
        for _ in range(count):
            block, _ = self._free.popitem(last=False)
            h = self._hash_of.pop(block, None)
            if h is not None:
                del self._by_hash[h]
                del self._tokens_of[block]
            self._refs[block] = 1
            blocks.append(block)
        return blocks

    def lookup(self, content_hash: bytes, tokens: Sequence[int]) -> int | None:
        """The cached block holding `tokens` under `content_hash`, or None (a digest registered for other tokens
        is a miss, never a hit)."""
        block = self._by_hash.get(content_hash)
        if block is None or self._tokens_of[block] != tuple(tokens):
            return None
        return block

    def touch(self, block: int) -> None:
        """Take a reference to a cached block (a prefix-cache hit)."""
        if self._refs[block] == 0:
            del self._free[block]
        self._refs[block] += 1

    def register(self, block: int, content_hash: bytes, tokens: Sequence[int]) -> bool:
        """Make a full block findable by the digest of its token prefix (first writer wins); whether `block` is
        now the one registered under `content_hash`."""
        if block in self._hash_of or content_hash in self._by_hash:
            return self._by_hash.get(content_hash) == block
        self._hash_of[block] = content_hash
        self._by_hash[content_hash] = block
        self._tokens_of[block] = tuple(tokens)
        return True

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each block; unreferenced blocks become reusable (most recent last)."""
        for b in reversed(blocks):  # a sequence's tail blocks are the least likely to be shared: evict them first
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free[b] = None
                if b not in self._hash_of:
                    self._free.move_to_end(b, last=False)  # plain empty blocks are taken before cached ones
            elif self._refs[b] < 0:
                raise RuntimeError(f"KV block {b} freed twice")
