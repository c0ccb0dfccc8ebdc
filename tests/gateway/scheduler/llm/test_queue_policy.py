"""The LLM queue policy on its own: the admission rate, refusals on arrival, timeouts, order, Retry-After."""

from __future__ import annotations

import pytest

from engines.types import GenerationRequest, SamplingParams
from gateway.errors import OverloadedError, RateLimitError
from gateway.repository.model_config import SchedulerConfig
from gateway.scheduler.llm.queue_policy import (
    MAX_RETRY_AFTER_S,
    AdmissionRate,
    QueuePolicy,
    retry_after_seconds,
)


def request(rid: str, priority: int = 0, timeout: float | None = None, arrival: float = 0.0) -> GenerationRequest:
    return GenerationRequest(
        rid, [1, 2, 3], SamplingParams(max_tokens=4), priority, arrival_time=arrival, queue_timeout=timeout
    )


def busy_rate(per_second: float, seconds: float = 10.0) -> AdmissionRate:
    """A rate that watched a queue drain at `per_second` for `seconds`, requests always left waiting."""
    rate = AdmissionRate()
    for i in range(int(seconds * per_second) + 1):
        rate.update(i / per_second, waiting=5, admitted=0 if i == 0 else 1)
    return rate


def test_the_rate_counts_admissions_that_left_others_waiting_over_the_time_the_queue_was_not_empty() -> None:
    rate = AdmissionRate()
    assert rate.per_second() is None
    # light load: each request waits a moment and is admitted at once, the queue empties: nothing to learn
    for i in range(100):
        rate.update(i, waiting=1)
        rate.update(i + 0.001, waiting=0, admitted=1)
    assert rate.per_second() is None
    # a backlog: 4 admissions a second while requests keep waiting
    for i in range(1, 41):
        rate.update(100 + i / 4, waiting=10, admitted=1)
    assert rate.per_second() == pytest.approx(4.0, rel=0.15)
    # idle time is no backlog, and what was learnt fades
    rate.update(500, waiting=0)
    rate.update(501, waiting=3)
    assert rate.per_second() is None


def test_a_request_whose_expected_wait_exceeds_its_timeout_is_refused_on_arrival() -> None:
    policy = QueuePolicy(SchedulerConfig(default_timeout_seconds=30))
    policy.rate = busy_rate(2.0)  # two requests start per second
    waiting = [request(f"w{i}") for i in range(10)]  # 5 s of waiting ahead
    policy.admit(request("fits", timeout=6.0), waiting)
    with pytest.raises(OverloadedError) as refused:
        policy.admit(request("late", timeout=4.0), waiting)
    err = refused.value
    assert isinstance(err, RateLimitError) and err.status == 429 and err.reason == "expected_wait"
    assert err.headers["Retry-After"] == "1"  # 5 s of wait - 4 s of timeout
    assert "10 requests are ahead" in err.message and "timeout of 4 s" in err.message
    # requests of a lower priority value are served first: those behind it do not count
    policy.admit(request("urgent", priority=-1, timeout=0.5), waiting)
    assert policy.rejected == {"expected_wait": 1}


def test_the_queue_is_bounded_and_unknown_rates_admit() -> None:
    policy = QueuePolicy(SchedulerConfig(max_queue_size=3))
    waiting = [request(f"w{i}") for i in range(3)]
    policy.admit(request("a", timeout=0.001), waiting[:2])  # no rate measured yet: only the bound applies
    with pytest.raises(OverloadedError) as full:
        policy.admit(request("b"), waiting)
    assert full.value.reason == "queue_full" and full.value.headers["Retry-After"] == "1"


def test_timeouts_default_override_and_none() -> None:
    assert QueuePolicy(SchedulerConfig()).timeout(request("a")) == 30.0
    assert QueuePolicy(SchedulerConfig()).timeout(request("a", timeout=2.5)) == 2.5
    fixed = QueuePolicy(SchedulerConfig(default_timeout_seconds=7, allow_timeout_override=False))
    assert fixed.timeout(request("a", timeout=2.5)) == 7
    none = QueuePolicy(SchedulerConfig(default_timeout_seconds=0))
    assert none.timeout(request("a")) is None
    none.rate = busy_rate(0.5)
    none.admit(request("a"), [request(f"w{i}") for i in range(100)])  # waits as long as it takes


def test_reject_and_delay_at_the_timeout() -> None:
    reject = QueuePolicy(SchedulerConfig())
    late = request("late", timeout=1.0, arrival=10.0)
    assert not reject.expired(late, 10.5) and reject.expired(late, 11.5)
    error = reject.on_expired(late, waiting=4)
    assert isinstance(error, OverloadedError) and error.reason == "queue_timeout" and "waited 1 s" in error.message
    assert reject.rejected == {"queue_timeout": 1}

    delay = QueuePolicy(SchedulerConfig(timeout_action="DELAY"))
    first, second = request("first", timeout=1.0, arrival=0.0), request("second", arrival=5.0)
    assert delay.on_expired(first, waiting=2) is None and not delay.expired(first, 100.0)
    ordered = sorted([(first, 0), (second, 1)], key=lambda p: delay.sort_key(p[0], p[1], now=6.0))
    assert [r.request_id for r, _ in ordered] == ["second", "first"]  # the delayed one goes behind
    delay.forget("first")
    ordered = sorted([(first, 0), (second, 1)], key=lambda p: delay.sort_key(p[0], p[1], now=6.0))
    assert [r.request_id for r, _ in ordered] == ["first", "second"]
    assert delay.rejected == {}


def test_retry_after_is_whole_seconds_within_bounds() -> None:
    assert retry_after_seconds(None) == 1
    assert retry_after_seconds(0.2) == 1
    assert retry_after_seconds(7.2) == 8
    assert retry_after_seconds(float("inf")) == MAX_RETRY_AFTER_S
    assert retry_after_seconds(1e9) == MAX_RETRY_AFTER_S
