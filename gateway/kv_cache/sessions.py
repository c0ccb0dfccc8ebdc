"""Stateful KV sessions: a conversation's KV blocks stay pinned between turns.

When a turn of session S finishes, its full blocks are pinned (one extra reference each), replacing the
previous turn's pins. The next turn re-renders the whole conversation, and prefix caching finds the pinned blocks,
so only the new tokens are prefilled. Pins end on TTL, on `DELETE /v1/sessions/{id}`, when pinned memory goes
over its cap (least recently used session first), or when the pool is needed to admit a request.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from dataclasses import dataclass

from gateway.kv_cache.block_pool import BlockPool


@dataclass
class _Session:
    blocks: list[int]
    last_used: float


class SessionStore:
    def __init__(self, pool: BlockPool, ttl_seconds: float, max_pinned_blocks: int) -> None:
        self._pool = pool
        self.ttl_seconds = ttl_seconds
        self.max_pinned_blocks = max_pinned_blocks
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # least recently used first
        self._pinned = 0  # pins summed over sessions: what the cap bounds
        self._holders: Counter[int] = Counter()  # block -> sessions pinning it (sessions share prefix blocks)

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    @property
    def pinned_blocks(self) -> int:
        """Distinct blocks that sessions hold: two sessions with one system prompt pin its blocks once."""
        return len(self._holders)

    def pin(self, session_id: str, blocks: list[int], now: float | None = None) -> None:
        """Pin `blocks` for the session, replacing what it pinned before."""
        for b in blocks:
            self._pool.touch(b)
        self.release(session_id)
        self._sessions[session_id] = _Session(blocks, time.monotonic() if now is None else now)
        self._pinned += len(blocks)
        self._holders.update(blocks)
        while self._pinned > self.max_pinned_blocks and self._sessions:
            self.evict_lru()

    def touch(self, session_id: str, now: float | None = None) -> None:
        if session_id in self._sessions:
            self._sessions[session_id].last_used = time.monotonic() if now is None else now
            self._sessions.move_to_end(session_id)

    def release(self, session_id: str) -> bool:
        """Unpin a session's blocks (they stay in the prefix cache until evicted); False if unknown."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        self._pool.free(session.blocks)
        self._pinned -= len(session.blocks)
        for block in session.blocks:
            self._holders[block] -= 1
            if not self._holders[block]:
                del self._holders[block]
        return True

    def evict_lru(self) -> bool:
        if not self._sessions:
            return False
        return self.release(next(iter(self._sessions)))

    def expire(self, now: float | None = None) -> int:
        """Release sessions idle for longer than the TTL; return how many.

        Runs every scheduler step, so it looks only at the least recently used end: sessions are kept in the
        order of their last use, and the first one still fresh ends the scan (O(expired), not O(sessions))."""
        now = time.monotonic() if now is None else now
        expired = 0
        while self._sessions:
            sid, session = next(iter(self._sessions.items()))
            if now - session.last_used <= self.ttl_seconds:
                break
            self.release(sid)
            expired += 1
        return expired
