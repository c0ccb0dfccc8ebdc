"""Route decisions: attempt order (ordered, weighted with a fixed seed), failure reasons, backoff."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gateway.errors import (
    BadGatewayError,
    GatewayTimeoutError,
    InvalidRequestError,
    ModelNotFoundError,
    RateLimitError,
    ServiceUnavailableError,
    UpstreamConnectionError,
)
from gateway.routes.config import Backoff, Route
from gateway.routes.policy import attempt_order, backoff_delay, failure_reason, retry_after


def test_ordered_routes_try_their_targets_in_order() -> None:
    route = Route.model_validate({"targets": ["a", "b", "c"]})
    assert attempt_order(route, random.Random(0)) == ["a", "b", "c"]


def test_weighted_routes_split_first_attempts_by_weight_and_fall_back_to_the_rest() -> None:
    route = Route.model_validate(
        {"strategy": "weighted", "targets": [{"model": "a", "weight": 9}, {"model": "b", "weight": 1}]}
    )
    rng = random.Random(7)
    orders = [attempt_order(route, rng) for _ in range(10_000)]
    firsts = Counter(order[0] for order in orders)
    assert 0.88 < firsts["a"] / 10_000 < 0.92
    assert all(sorted(order) == ["a", "b"] for order in orders)  # every model is still a fallback


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (UpstreamConnectionError("refused"), "connect"),
        (GatewayTimeoutError("slow"), "timeout"),
        (TimeoutError(), "timeout"),
        (RateLimitError("busy"), "429"),
        (ServiceUnavailableError("down"), "5xx"),
        (BadGatewayError("upstream 500"), "5xx"),
        (InvalidRequestError("bad field"), None),
        (ModelNotFoundError("x"), None),
        (ValueError("a bug"), None),
    ],
)
def test_failure_reasons(error: BaseException, reason: str | None) -> None:
    assert failure_reason(error) == reason


def test_backoff_grows_exponentially_up_to_its_cap() -> None:
    backoff = Backoff(initial_seconds=0.5, multiplier=2, max_seconds=3, jitter=0)
    rng = random.Random(0)
    assert [backoff_delay(backoff, n, rng) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 3.0]


def test_backoff_jitter_stays_within_its_fraction() -> None:
    backoff = Backoff(initial_seconds=1, multiplier=2, max_seconds=10, jitter=0.25)
    rng = random.Random(3)
    delays = [backoff_delay(backoff, 1, rng) for _ in range(1000)]
    assert 0.75 <= min(delays) < 0.8 and 1.2 < max(delays) <= 1.25


def test_a_longer_retry_after_wins_within_the_cap() -> None:
    backoff = Backoff(initial_seconds=0.1, multiplier=2, max_seconds=2, jitter=0)
    rng = random.Random(0)
    assert backoff_delay(backoff, 1, rng, after=1.5) == 1.5
    assert backoff_delay(backoff, 1, rng, after=30) == 2
    assert retry_after(RateLimitError("busy", headers={"Retry-After": "1.5"})) == 1.5
    assert retry_after(RateLimitError("busy")) is None
