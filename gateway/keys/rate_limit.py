"""Per-key rate limits: requests per minute and tokens per minute, as token buckets.

Requests are counted when they arrive. Tokens (prompt + generated) are known only once a request has run, so they
are charged afterwards and may put a key's bucket in debt; while it is in debt, the key's new requests get 429
with `Retry-After` saying when the debt is paid off. Admitted requests always finish: limits only refuse new ones.

Callers without a key are limited per client address. The table of buckets is bounded (least recently seen
callers are forgotten first), so a flood of addresses cannot grow it without end.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from gateway.errors import RateLimitError

MAX_TRACKED_CALLERS = 10_000


@dataclass
class TokenBucket:
    """`capacity` units, refilled continuously over a minute; the level may go below zero (debt)."""

    capacity: float
    level: float
    updated: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.updated) * self.capacity / 60.0)
        self.updated = now

    def seconds_until(self, units: float) -> float:
        """How long until `units` can be taken (0 if they can be now)."""
        missing = units - self.level
        return 0.0 if missing <= 0 else missing * 60.0 / self.capacity


class RateLimiter:
    """Buckets per caller; 0 disables a limit."""

    def __init__(
        self, requests_per_minute: int = 0, tokens_per_minute: int = 0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rpm = requests_per_minute
        self.tpm = tokens_per_minute
        self._clock = clock
        self._callers: OrderedDict[str, tuple[TokenBucket | None, TokenBucket | None]] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return bool(self.rpm or self.tpm)

    def _buckets(self, caller: str, now: float) -> tuple[TokenBucket | None, TokenBucket | None]:
        buckets = self._callers.get(caller)
        if buckets is None:
            buckets = (
                TokenBucket(self.rpm, self.rpm, now) if self.rpm else None,
                TokenBucket(self.tpm, self.tpm, now) if self.tpm else None,
            )
            self._callers[caller] = buckets
            if len(self._callers) > MAX_TRACKED_CALLERS:
                self._callers.popitem(last=False)
        self._callers.move_to_end(caller)
        for bucket in buckets:
            if bucket is not None:
                bucket.refill(now)
        return buckets

    def admit(self, caller: str) -> None:
        """Take one request from `caller`'s allowance, or raise RateLimitError (429) with Retry-After."""
        if not self.enabled:
            return
        requests, tokens = self._buckets(caller, self._clock())
        wait = max(
            requests.seconds_until(1) if requests else 0.0,
            tokens.seconds_until(min(1.0, tokens.capacity)) if tokens else 0.0,
        )
        if wait > 0:
            what = "requests" if requests and requests.level < 1 else "tokens"
            raise RateLimitError(
                f"rate limit reached for {what} per minute; retry in {math.ceil(wait)} s",
                headers={"Retry-After": str(math.ceil(wait))},
            )
        if requests:
            requests.level -= 1

    def charge_tokens(self, caller: str, count: int) -> None:
        if self.tpm and count > 0:
            _, tokens = self._buckets(caller, self._clock())
            if tokens:
                tokens.level -= count


_current: ContextVar[tuple[RateLimiter, str] | None] = ContextVar("switchyard_rate_limit_account", default=None)


def bind_caller(limiter: RateLimiter, caller: str) -> None:
    """Attribute the tokens of the work done in this request's context to `caller`."""
    if limiter.tpm:
        _current.set((limiter, caller))


def charge_tokens(count: int) -> None:
    """Charge tokens to the caller of the current request (no-op outside a rate-limited request)."""
    account = _current.get()
    if account is not None:
        account[0].charge_tokens(account[1], count)
