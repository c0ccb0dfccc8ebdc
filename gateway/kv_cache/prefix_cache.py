"""Content hashes of full KV blocks, chained so a block's hash names its whole token prefix.

Two sequences share a block only if every token before and inside it is equal, which is exactly when the
block's keys and values are equal (same tokens at the same positions).
"""

from __future__ import annotations

from collections.abc import Sequence

ROOT_HASH = hash("switchyard-kv-root")


def block_hash(parent: int, tokens: Sequence[int]) -> int:
    return hash((parent, tuple(tokens)))


def prefix_hashes(tokens: Sequence[int], block_size: int, num_blocks: int, parent: int = ROOT_HASH) -> list[int]:
    """Hashes of the first `num_blocks` full blocks of `tokens`."""
    out = []
    for i in range(num_blocks):
        parent = block_hash(parent, tokens[i * block_size : (i + 1) * block_size])
        out.append(parent)
    return out
