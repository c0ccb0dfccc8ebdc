"""Per-key limits on an injected clock: sliding per-minute windows, budgets, Retry-After, and keys kept apart."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from gateway.errors import QuotaExceededError, RateLimitError
from gateway.keys.limits import KeyLimiter, SlidingWindow
from gateway.keys.policy import KeyPolicy, KeyRecord


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def key(key_id: str = "key_a", **policy: object) -> KeyRecord:
    return KeyRecord(key_id, key_id.removeprefix("key_"), "digest-" + key_id, "sk-sy-x", KeyPolicy(**policy))


WALL = datetime(2026, 3, 10, 12, 0, tzinfo=UTC).timestamp()


def test_a_window_forgets_what_is_older_than_a_minute() -> None:
    window = SlidingWindow()
    window.add(0.5, 5)
    window.add(10.2, 3)
    assert window.wait(30.0, limit=8, units=1) == pytest.approx(30.0)  # when second 0's 5 units leave
    assert window.wait(30.0, limit=9, units=1) == 0.0
    assert window.total(59.9) == 8
    assert window.total(60.0) == 3  # the slot of second 0 left at 60
    assert window.total(200.0) == 0


def test_requests_per_minute_refuse_with_retry_after_then_admit_again() -> None:
    clock = Clock()
    limiter = KeyLimiter(clock=clock)
    k = key(rpm=3)
    for _ in range(3):
        limiter.admit(k, 0, 0.0, WALL)
    with pytest.raises(RateLimitError) as refused:
        limiter.admit(k, 0, 0.0, WALL)
    assert refused.value.status == 429 and refused.value.code == "rate_limit_exceeded"
    assert refused.value.headers["Retry-After"] == "60" and "3 requests per minute" in refused.value.message
    clock.now += 60
    limiter.admit(k, 0, 0.0, WALL)


def test_tokens_per_minute_count_tokens_charged_after_admission() -> None:
    clock = Clock()
    limiter = KeyLimiter(clock=clock)
    k = key(tpm=1000)
    limiter.admit(k, 0, 0.0, WALL)
    limiter.charge(k.id, 1200)  # a request may take the key past its limit; the next ones wait
    clock.now += 20
    with pytest.raises(RateLimitError) as refused:
        limiter.admit(k, 0, 0.0, WALL)
    assert refused.value.headers["Retry-After"] == "40" and "tokens per minute" in refused.value.message
    clock.now += 40
    limiter.admit(k, 0, 0.0, WALL)


def test_requests_in_flight_count_what_they_are_expected_to_produce() -> None:
    limiter = KeyLimiter(clock=Clock())
    k = key(tpm=1000)
    limiter.admit(k, 0, 0.0, WALL)
    limiter.charge(k.id, 100)
    limiter.release(k.id, 100)  # the key's requests average 100 tokens
    for _ in range(9):  # the window's 100 + 8 requests expected to make 100 each + 1 still fit under 1000
        limiter.admit(k, 0, 0.0, WALL)
    with pytest.raises(RateLimitError):
        limiter.admit(k, 0, 0.0, WALL)  # 100 + 9 x 100: no room left for what is already running
    limiter.charge(k.id, 10)
    limiter.release(k.id, 10)  # one ends small: the average drops, and with it what the others are expected to make
    limiter.admit(k, 0, 0.0, WALL)
    metadata = key("key_m", tpm=1000)
    for _ in range(3):
        limiter.admit(metadata, 0, 0.0, WALL)
        limiter.release(metadata.id, 0, sample=False)  # reads of metadata do not shape the average
    assert limiter.windows(metadata.id).tokens_per_request == 0.0 and limiter.windows(metadata.id).in_flight == 0


def test_one_key_at_its_limit_never_refuses_another() -> None:
    limiter = KeyLimiter(clock=Clock())
    busy, other = key("key_busy", rpm=1, tpm=10), key("key_other", rpm=1, tpm=10)
    limiter.admit(busy, 0, 0.0, WALL)
    limiter.charge(busy.id, 500)
    with pytest.raises(RateLimitError):
        limiter.admit(busy, 0, 0.0, WALL)
    limiter.admit(other, 0, 0.0, WALL)


def test_server_defaults_apply_to_keys_without_limits_and_zero_means_none() -> None:
    limiter = KeyLimiter(default_rpm=1, clock=Clock())
    defaulted, unlimited = key("key_d"), key("key_u", rpm=0)
    limiter.admit(defaulted, 0, 0.0, WALL)
    with pytest.raises(RateLimitError):
        limiter.admit(defaulted, 0, 0.0, WALL)
    for _ in range(100):
        limiter.admit(unlimited, 0, 0.0, WALL)


def test_a_spent_budget_is_insufficient_quota_until_the_period_ends() -> None:
    limiter = KeyLimiter(clock=Clock())
    k = key(budget_tokens=100, budget_period="day")
    limiter.admit(k, 99, 0.0, WALL)
    with pytest.raises(QuotaExceededError) as refused:
        limiter.admit(k, 100, 0.0, WALL)
    assert refused.value.status == 429 and refused.value.code == "insufficient_quota"
    assert refused.value.headers["Retry-After"] == str(12 * 3600)  # noon: the UTC day renews in 12 hours
    costly = key("key_c", budget_cost=1.5, budget_period="month")
    with pytest.raises(QuotaExceededError, match="cost budget"):
        limiter.admit(costly, 0, 1.5, WALL)


@dataclass
class Worker:
    """A client that never stops asking: one request at a time, each producing its tokens over a few seconds."""

    key: KeyRecord
    wait_until: float = 0.0
    left: int = 0  # tokens its request in flight has still to produce
    made: int = 0  # tokens it has produced


def test_admitted_tokens_over_five_minutes_stay_within_five_percent_of_the_limit() -> None:
    """Three clients per key, requests of 40 to 160 tokens (half prompt, charged at once; half generated at 30 per
    second), a 429 honoured by waiting its Retry-After: each key is admitted five minutes of its limit, within 5%,
    with no first-minute burst and no overrun by the requests in flight."""
    clock, rng = Clock(0.0), random.Random(7)
    limiter = KeyLimiter(clock=clock)
    limits = {"key_small": 1500, "key_large": 6000}
    workers = [Worker(key(name, tpm=tpm)) for name, tpm in limits.items() for _ in range(3)]
    admitted = dict.fromkeys(limits, 0)
    while clock.now < 300.0:
        for w in workers:
            if w.left:
                produced = min(w.left, 3)
                limiter.charge(w.key.id, produced)
                w.left, w.made = w.left - produced, w.made + produced
                if not w.left:
                    limiter.release(w.key.id, w.made)
            elif clock.now >= w.wait_until:
                try:
                    limiter.admit(w.key, 0, 0.0, WALL)
                except RateLimitError as refused:
                    w.wait_until = clock.now + int(refused.headers["Retry-After"])
                    continue
                size = rng.randint(40, 160)
                limiter.charge(w.key.id, size // 2)  # the prompt, at the first token
                w.left, w.made = size - size // 2, size // 2
                admitted[w.key.id] += size
        clock.now += 0.1
    for name, tpm in limits.items():
        assert admitted[name] == pytest.approx(5 * tpm, rel=0.05), admitted
