"""Which upstream gets a request: session affinity first, otherwise the least outstanding requests.

Affinity uses rendezvous (highest-random-weight) hashing of the session id over the healthy upstreams. It needs
no table: every gateway replica sends a session to the same upstream (so its prefix cache and KV session are
reused), and when an upstream dies only its own sessions move, each to its next-highest upstream.

Without a session, the upstream with the fewest requests in flight from this gateway wins; ties rotate so that a
lightly loaded pool still spreads sequential requests evenly.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Collection, Sequence

from engines.remote.upstream import Upstream


def _weight(session_id: str, upstream: Upstream) -> int:
    digest = hashlib.blake2b(f"{session_id}\0{upstream.base_url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Router:
    def __init__(self, upstreams: Sequence[Upstream]) -> None:
        self.upstreams = list(upstreams)
        self._turn = itertools.count()

    def pick(self, session_id: str | None, exclude: Collection[Upstream] = ()) -> Upstream | None:
        """The upstream for the next attempt, or None when no healthy one is left to try."""
        candidates = [u for u in self.upstreams if u.healthy and u not in exclude]
        if not candidates:
            return None
        if session_id:
            return max(candidates, key=lambda u: _weight(session_id, u))
        start = next(self._turn) % len(candidates)
        rotated = candidates[start:] + candidates[:start]
        return min(rotated, key=lambda u: u.outstanding)

    def affinity(self, session_id: str) -> Upstream | None:
        """Where `session_id` goes now (None if no upstream is healthy)."""
        return self.pick(session_id)
