"""The route runner: fallbacks, retries with backoff (the clock's waits recorded, not slept), timeouts, targets
that are not loaded, failures that are the client's, and what the headers and counters say."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from gateway.errors import (
    GatewayTimeoutError,
    InvalidRequestError,
    ModelNotFoundError,
    RateLimitError,
    ServiceUnavailableError,
    UpstreamConnectionError,
)
from gateway.routes.config import RoutesFile
from gateway.routes.runner import Routes, current_outcome

LOADED = {"a", "b", "c"}


def lookup(name: str) -> str:
    if name not in LOADED:
        raise ModelNotFoundError(name)
    return name


class Models:
    """Each model answers with its name, or fails as scripted (a list of errors, consumed in order)."""

    def __init__(self, **script: list[BaseException]) -> None:
        self.script = script
        self.calls: list[str] = []

    async def __call__(self, model: str) -> str:
        self.calls.append(model)
        failures = self.script.get(model) or []
        if failures:
            raise failures.pop(0)
        return f"answer of {model}"


def routes(spec: dict, waits: list[float] | None = None) -> Routes:  # type: ignore[type-arg]
    async def sleep(seconds: float) -> None:
        if waits is not None:
            waits.append(seconds)

    return Routes(RoutesFile.model_validate({"routes": spec}), rng=random.Random(1), sleep=sleep)


async def run(table: Routes, name: str, work: Callable) -> tuple[str, dict[str, str]]:  # type: ignore[type-arg]
    holder: list = []  # type: ignore[type-arg]
    token = current_outcome.set(holder)
    try:
        result = await table.run(name, lookup, work)
    finally:
        current_outcome.reset(token)
    return result, holder[-1].headers()


async def test_a_name_without_a_route_is_the_model_itself() -> None:
    table = routes({"alias": "a"})
    assert await table.run("b", lookup, Models()) == "answer of b"
    with pytest.raises(ModelNotFoundError):
        await table.run("nowhere", lookup, Models())


async def test_an_alias_serves_its_model_and_says_so() -> None:
    result, headers = await run(routes({"gpt-4o-mini": "a"}), "gpt-4o-mini", Models())
    assert result == "answer of a"
    assert headers == {"x-switchyard-route": "gpt-4o-mini", "x-switchyard-attempts": "1", "x-switchyard-model": "a"}


async def test_failures_fall_back_in_order() -> None:
    table = routes({"chat": ["a", "b", "c"]})
    models = Models(a=[UpstreamConnectionError("refused")], b=[ServiceUnavailableError("down")])
    result, headers = await run(table, "chat", models)
    assert result == "answer of c" and models.calls == ["a", "b", "c"]
    assert headers["x-switchyard-attempts"] == "3" and headers["x-switchyard-model"] == "c"
    assert headers["x-switchyard-fallbacks"] == "a:connect, b:5xx"
    assert table.stats.fallbacks == {("chat", "a", "connect"): 1, ("chat", "b", "5xx"): 1}
    assert table.stats.served == {("chat", "c"): 1} and table.stats.attempts == {"chat": 3}


async def test_the_clients_errors_do_not_fall_back() -> None:
    table = routes({"chat": ["a", "b"]})
    models = Models(a=[InvalidRequestError("temperature: too high", param="temperature")])
    with pytest.raises(InvalidRequestError, match="temperature"):
        await table.run("chat", lookup, models)
    assert models.calls == ["a"]


async def test_only_the_listed_failures_fall_back() -> None:
    table = routes({"chat": {"targets": ["a", "b"], "fallback_on": ["connect"]}})
    models = Models(a=[RateLimitError("busy")])
    with pytest.raises(RateLimitError):
        await table.run("chat", lookup, models)
    assert models.calls == ["a"] and table.stats.failed == {("chat", "429"): 1}


async def test_retries_back_off_exponentially_then_fall_back() -> None:
    waits: list[float] = []
    spec = {
        "targets": ["a", "b"],
        "retries": 2,
        "retry_on": ["429"],
        "backoff": {"initial_seconds": 0.1, "multiplier": 2, "max_seconds": 1, "jitter": 0},
    }
    table = routes({"chat": spec}, waits)
    models = Models(a=[RateLimitError("busy")] * 3)
    result, headers = await run(table, "chat", models)
    assert result == "answer of b" and models.calls == ["a", "a", "a", "b"]
    assert waits == [0.1, 0.2]
    assert headers["x-switchyard-attempts"] == "4" and headers["x-switchyard-fallbacks"] == "a:429"
    assert table.stats.retries == {("chat", "a", "429"): 2}


async def test_a_retry_that_succeeds_stays_on_its_model() -> None:
    waits: list[float] = []
    table = routes({"chat": {"targets": ["a", "b"], "retries": 1}}, waits)
    models = Models(a=[RateLimitError("busy", headers={"Retry-After": "0.75"})])
    result, _ = await run(table, "chat", models)
    assert result == "answer of a" and len(waits) == 1 and waits[0] >= 0.75  # the model's Retry-After wins


async def test_failures_not_in_retry_on_are_not_retried() -> None:
    waits: list[float] = []
    table = routes({"chat": {"targets": ["a", "b"], "retries": 3}}, waits)
    models = Models(a=[ServiceUnavailableError("down")])
    result, _ = await run(table, "chat", models)
    assert result == "answer of b" and models.calls == ["a", "b"] and waits == []


async def test_a_slow_model_times_out_and_falls_back() -> None:
    async def work(model: str) -> str:
        if model == "a":
            await asyncio.sleep(10)
        return model

    table = routes({"chat": {"targets": ["a", "b"], "timeout_seconds": 0.05}})
    result, headers = await run(table, "chat", work)
    assert result == "b" and headers["x-switchyard-fallbacks"] == "a:timeout"


async def test_every_model_failing_raises_the_last_failure() -> None:
    table = routes({"chat": {"targets": ["a", "b"], "timeout_seconds": 0.05}})

    async def work(model: str) -> str:
        if model == "a":
            raise UpstreamConnectionError("refused")
        await asyncio.sleep(10)
        return model

    with pytest.raises(GatewayTimeoutError, match=r"'b' did not answer within 0\.05 s"):
        await table.run("chat", lookup, work)
    assert table.stats.failed == {("chat", "timeout"): 1}


async def test_targets_that_are_not_loaded_are_passed_over() -> None:
    table = routes({"chat": ["gone", "b"], "nothing": ["gone", "missing"]})
    result, headers = await run(table, "chat", Models())
    assert result == "answer of b" and headers["x-switchyard-fallbacks"] == "gone:not_loaded"
    with pytest.raises(ModelNotFoundError, match="'gone'"):
        await table.run("nothing", lookup, Models())


async def test_the_counters_are_exposed_to_prometheus() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from gateway.routes.metrics import RouteCollector

    table = routes({"chat": ["a", "b"]})
    await table.run("chat", lookup, Models(a=[UpstreamConnectionError("refused")]))
    registry = CollectorRegistry()
    registry.register(RouteCollector(table))
    text = generate_latest(registry).decode()
    assert 'switchyard_route_requests_total{model="b",route="chat"} 1.0' in text
    assert 'switchyard_route_attempts_total{route="chat"} 2.0' in text
    assert 'switchyard_route_fallbacks_total{model="a",reason="connect",route="chat"} 1.0' in text
