"""A fixed pool of KV blocks with reference counts.

The engine owns the memory (`num_blocks * block_size` slots per layer); this pool only hands out block ids.
Reference counts let several sequences share a block (prefix caching, n>1) later without changing callers.
"""

from __future__ import annotations

from collections import deque


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("a KV block pool needs at least one block")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self, count: int) -> list[int]:
        """Take `count` free blocks; raises if fewer are free (callers check `num_free` first)."""
        if count > len(self._free):
            raise RuntimeError(f"asked for {count} KV blocks, {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(count)]
        for b in blocks:
            self._refs[b] = 1
        return blocks

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each block; blocks nobody references return to the pool."""
        for b in blocks:
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free.append(b)
            elif self._refs[b] < 0:
                raise RuntimeError(f"KV block {b} freed twice")
