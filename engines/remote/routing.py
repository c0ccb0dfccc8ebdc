"""Which upstream gets a request: session affinity first, then the upstream holding the longest cached prefix of
the prompt (within a load bound), otherwise the least outstanding requests.

Affinity uses rendezvous (highest-random-weight) hashing of the session id over the healthy upstreams. It needs
no table: every gateway replica sends a session to the same upstream (so its prefix cache and KV session are
reused), and when an upstream dies only its own sessions move, each to its next-highest upstream.

Cache-aware routing (policy `cache_aware`, as SGLang's router does): the gateway keeps an approximate tree of the
prompts it recently sent to each upstream (prefix_index.py). When some upstream probably holds at least
`cache_threshold` of the prompt, the one holding the most gets it, so the prompt's prefix is read from cache
instead of prefilled again. A load bound keeps one hot prefix from piling every request onto one upstream: an
upstream with more than `balance_abs` requests in flight above the least busy one (and more than `balance_rel`
times as many) is passed over, and the request goes to the least busy upstream, which then caches that prefix too.

Least outstanding is the fallback (and the whole policy `least_outstanding`): the upstream with the fewest requests
in flight from this gateway wins; ties rotate so that a lightly loaded pool still spreads sequential requests evenly.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from engines.remote.prefix_index import PrefixIndex, block_chain
from engines.remote.upstream import Upstream


@dataclass(frozen=True)
class RoutingSettings:
    """How requests without a session are spread; see the module docstring."""

    policy: Literal["cache_aware", "least_outstanding"] = "cache_aware"
    block_tokens: int = 16  # granularity of the prefix tree (match the upstreams' KV block size)
    cache_tokens: int = 65536  # prompt tokens remembered per upstream: about its KV pool
    cache_threshold: float = 0.5  # least fraction of the prompt probably cached for the prefix to decide
    balance_abs: int = 2  # an upstream this many requests busier than the least busy one ...
    balance_rel: float = 1.5  # ... and this many times as busy is skipped by cache-aware routing


def _weight(session_id: str, upstream: Upstream) -> int:
    digest = hashlib.blake2b(f"{session_id}\0{upstream.base_url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Router:
    def __init__(self, upstreams: Sequence[Upstream], settings: RoutingSettings | None = None) -> None:
        self.upstreams = list(upstreams)
        self.settings = settings or RoutingSettings()
        self.index = PrefixIndex(self.settings.block_tokens, self.settings.cache_tokens)
        self._turn = itertools.count()

    def pick(
        self, session_id: str | None, exclude: Collection[Upstream] = (), prompt: Sequence[int] = ()
    ) -> Upstream | None:
        """The upstream for the next attempt, or None when no healthy one is left to try. With a `prompt`, the
        choice is recorded as that upstream now caching it."""
        for u in self.upstreams:
            if not u.healthy:  # a down upstream may come back restarted, its cache empty
                self.index.forget(u)
        candidates = [u for u in self.upstreams if u.healthy and u not in exclude]
        if not candidates:
            return None
        cache_aware = self.settings.policy == "cache_aware" and len(prompt) >= self.settings.block_tokens
        chain = block_chain(prompt, self.settings.block_tokens) if cache_aware else []
        chosen: Upstream | None = None
        if session_id:
            chosen = max(candidates, key=lambda u: _weight(session_id, u))
        elif chain:
            chosen = self._by_prefix(candidates, chain, len(prompt))
        if chosen is None:
            start = next(self._turn) % len(candidates)
            rotated = candidates[start:] + candidates[:start]
            chosen = min(rotated, key=lambda u: u.outstanding)
        if chain:
            self.index.insert(chosen, chain)
        return chosen

    def _by_prefix(self, candidates: list[Upstream], chain: list[int], prompt_len: int) -> Upstream | None:
        """The upstream with the longest probably-cached prefix, if long enough and not overloaded."""
        s = self.settings
        least = min(u.outstanding for u in candidates)
        matched = {u: self.index.matched_tokens(u, chain) for u in candidates}
        best = max(candidates, key=lambda u: (matched[u], -u.outstanding))
        if matched[best] < s.cache_threshold * prompt_len:
            return None
        overloaded = best.outstanding - least > s.balance_abs and best.outstanding > s.balance_rel * least
        return None if overloaded else best

    def affinity(self, session_id: str) -> Upstream | None:
        """Where `session_id` goes now (None if no upstream is healthy)."""
        return self.pick(session_id)
