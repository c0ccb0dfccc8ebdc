"""What each upstream probably has in its prefix cache: an approximate tree of the prompts recently sent to it.

The gateway cannot see an upstream's KV cache, so it remembers what it sent (as SGLang's router does). A prompt is
cut into blocks of `block_tokens` token ids; block i is named by a hash chained over blocks 0..i, so a name stands
for a whole prefix and the names of one upstream form a tree (a prefix tree at block granularity: two prompts share
exactly the nodes of their common whole-block prefix). Matching a prompt walks its chain from the root until the
first name the upstream has not seen.

Each upstream's tree is bounded by `capacity_tokens` (about its KV pool) and forgets the least recently routed
blocks first, the way the upstream's own cache evicts. A prompt's blocks are touched deepest first, so a parent is
always more recent than its children and eviction removes leaves before the prefixes they hang from.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


def block_chain(token_ids: Sequence[int], block_tokens: int) -> list[int]:
    """The chained names of the prompt's whole blocks (a trailing partial block is not cached by block caches)."""
    names: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        parent = hash((parent, tuple(token_ids[start : start + block_tokens])))
        names.append(parent)
    return names


class PrefixIndex:
    """Per-upstream approximate prefix trees, keyed by any hashable upstream handle."""

    def __init__(self, block_tokens: int, capacity_tokens: int) -> None:
        if block_tokens < 1 or capacity_tokens < block_tokens:
            raise ValueError("block_tokens must be >= 1 and capacity_tokens >= block_tokens")
        self.block_tokens = block_tokens
        self._capacity_blocks = capacity_tokens // block_tokens
        self._trees: dict[Hashable, OrderedDict[int, None]] = {}

    def matched_tokens(self, upstream: Hashable, chain: Sequence[int]) -> int:
        """How many leading prompt tokens `upstream` probably has cached."""
        tree = self._trees.get(upstream)
        if not tree:
            return 0
        depth = 0
        for name in chain:
            if name not in tree:
                break
            depth += 1
        return depth * self.block_tokens

    def insert(self, upstream: Hashable, chain: Sequence[int]) -> None:
        """Record that `upstream` was sent this prompt (it will hold its blocks once it has prefilled them)."""
        tree = self._trees.setdefault(upstream, OrderedDict())
        for name in reversed(chain):  # deepest first: the root ends up most recent and is evicted last
            tree[name] = None
            tree.move_to_end(name)
        while len(tree) > self._capacity_blocks:
            tree.popitem(last=False)

    def forget(self, upstream: Hashable) -> None:
        """Drop an upstream's tree (it restarted or went down: its cache is gone)."""
        self._trees.pop(upstream, None)

    def size_tokens(self, upstream: Hashable) -> int:
        return len(self._trees.get(upstream, ())) * self.block_tokens
