"""Token buckets per caller: requests and tokens per minute, Retry-After, bounded table."""

from __future__ import annotations

import pytest

from gateway.errors import RateLimitError
from gateway.keys import rate_limit
from gateway.keys.rate_limit import RateLimiter, bind_caller, charge_tokens


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_requests_per_minute_refill() -> None:
    clock = Clock()
    limiter = RateLimiter(requests_per_minute=3, clock=clock)
    for _ in range(3):
        limiter.admit("a")
    with pytest.raises(RateLimitError) as err:
        limiter.admit("a")
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "20"  # one request per 20 s
    limiter.admit("b")  # another caller has its own bucket
    clock.now += 20
    limiter.admit("a")
    with pytest.raises(RateLimitError):
        limiter.admit("a")


def test_tokens_are_charged_after_the_fact() -> None:
    clock = Clock()
    limiter = RateLimiter(tokens_per_minute=600, clock=clock)
    limiter.admit("a")
    limiter.charge_tokens("a", 900)  # the request ran: 300 tokens of debt
    with pytest.raises(RateLimitError) as err:
        limiter.admit("a")
    assert "tokens" in err.value.message and err.value.headers["Retry-After"] == "31"  # (300 + 1) tokens at 10/s
    clock.now += 31
    limiter.admit("a")


def test_disabled_limiter_admits_everything() -> None:
    limiter = RateLimiter()
    for _ in range(1000):
        limiter.admit("a")
    limiter.charge_tokens("a", 10**9)
    limiter.admit("a")


def test_caller_table_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rate_limit, "MAX_TRACKED_CALLERS", 10)
    limiter = RateLimiter(requests_per_minute=1, clock=Clock())
    for i in range(100):
        limiter.admit(f"ip:{i}")
    assert len(limiter._callers) == 10


async def test_charge_goes_to_the_bound_caller() -> None:
    clock = Clock()
    limiter = RateLimiter(tokens_per_minute=100, clock=clock)
    charge_tokens(50)  # outside a request: nobody to charge, no error
    bind_caller(limiter, "key:x")
    charge_tokens(150)
    with pytest.raises(RateLimitError):
        limiter.admit("key:x")
    limiter.admit("key:y")
