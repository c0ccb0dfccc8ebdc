"""Content digests of full KV blocks, chained so a block's digest names its whole token prefix.

Two sequences may share a block only if every token before and inside it is equal, which is exactly when the
block's keys and values are equal (same tokens at the same positions). A wrong hit would serve one prompt's keys
and values to another, so the digest is SHA-256 over the parent's digest and the block's token ids (vLLM's
`sha256` prefix-caching hash), which nobody can collide on purpose, and the pool still compares a hit's own tokens
(`BlockPool.lookup`) before handing it out.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

ROOT_HASH = hashlib.sha256(b"switchyard-kv-root").digest()


def root_hash(adapter_id: int = 0) -> bytes:
    """The digest a sequence's chain starts from: the base model's, or one per LoRA adapter (its id, unique per
    load), so that blocks computed under one adapter's weights are never found for another's or the base model's."""
    return ROOT_HASH if not adapter_id else hashlib.sha256(ROOT_HASH + b"lora" + str(adapter_id).encode()).digest()


def block_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The digest of a block holding `tokens` after the prefix whose last block's digest is `parent`."""
    return hashlib.sha256(parent + array("q", tokens).tobytes()).digest()


def extend_hashes(
    hashes: list[bytes], tokens: Sequence[int], block_size: int, num_blocks: int, root: bytes = ROOT_HASH
) -> list[bytes]:
    """Grow `hashes` (the digests of a sequence's leading full blocks, computed so far) to `num_blocks` entries;
    `root`: the chain's start (`root_hash`).

    A sequence only ever appends tokens, so its digests are computed once and kept."""
    while len(hashes) < num_blocks:
        i = len(hashes)
        hashes.append(block_hash(hashes[-1] if hashes else root, tokens[i * block_size : (i + 1) * block_size]))
    return hashes


def prefix_hashes(tokens: Sequence[int], block_size: int, num_blocks: int, root: bytes = ROOT_HASH) -> list[bytes]:
    """Digests of the first `num_blocks` full blocks of `tokens`."""
    return extend_hashes([], tokens, block_size, num_blocks, root)
