"""Serve a request over a route: its models tried in the route's order, each failure retried or fallen back on as
the route says, and what happened kept for the response headers (headers.py) and the metrics (metrics.py).

The frontends call `Routes.run(name, lookup, work)` with the model name the client sent: a name that is no route
is looked up and served as before. `work` is the whole handler for one model (a chat completion, a Messages
answer), up to its response: for a stream, up to its first chunk (the handlers prime their streams), so a model
that fails before it has sent anything is replaced, and one that fails after is not -- text already sent cannot be
taken back.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TypeVar

from gateway.errors import GatewayTimeoutError, ServiceUnavailableError, SwitchyardError
from gateway.routes.config import Route, RoutesFile
from gateway.routes.policy import attempt_order, backoff_delay, failure_reason, retry_after

log = logging.getLogger("switchyard.routes")

M = TypeVar("M")
T = TypeVar("T")

NOT_LOADED = "not_loaded"  # a fallback past a target that no loaded model serves (always taken)


@dataclass
class RouteOutcome:
    """One routed request: its route, the model that served it, its attempts and the fallbacks taken."""

    route: str
    model: str | None = None
    attempts: int = 0
    fallbacks: list[tuple[str, str]] = field(default_factory=list)  # (model left, reason)

    def headers(self) -> dict[str, str]:
        headers = {"x-switchyard-route": self.route, "x-switchyard-attempts": str(self.attempts)}
        if self.model is not None:
            headers["x-switchyard-model"] = self.model
        if self.fallbacks:
            headers["x-switchyard-fallbacks"] = ", ".join(f"{model}:{reason}" for model, reason in self.fallbacks)
        return headers


# The outcome of the request being served, for its response headers: headers.py sets a fresh holder per request.
current_outcome: ContextVar[list[RouteOutcome] | None] = ContextVar("switchyard_route_outcome", default=None)


@dataclass
class RouteStats:
    """Counters for the metrics (labels: route and model names from the routes file, reasons from a fixed set)."""

    served: Counter[tuple[str, str]] = field(default_factory=Counter)  # (route, model)
    attempts: Counter[str] = field(default_factory=Counter)  # route
    retries: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (route, model, reason)
    fallbacks: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (route, model left, reason)
    failed: Counter[tuple[str, str]] = field(default_factory=Counter)  # (route, reason of the last failure)


class Routes:
    def __init__(
        self,
        routes: RoutesFile | None = None,
        *,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`rng`, `sleep`: the weighted draws' randomness and the backoff's wait (tests pass their own)."""
        self.table: dict[str, Route] = dict(routes.routes) if routes is not None else {}
        self.stats = RouteStats()
        self._rng = rng or random.Random()
        self._sleep = sleep

    def get(self, name: str) -> Route | None:
        return self.table.get(name)

    async def run(self, name: str, lookup: Callable[[str], M | Awaitable[M]], work: Callable[[M], Awaitable[T]]) -> T:
        """`work` on the model `name` names, or over the route `name` names: its models in order, with retries and
        fallbacks. Raises the last failure when every model has failed, or at once a failure that is not a model's
        (the client's request is at fault: the next model would refuse it too)."""
        route = self.table.get(name)
        if route is None:
            return await work(await _found(lookup(name)))
        outcome = RouteOutcome(name)
        holder = current_outcome.get()
        if holder is not None:
            holder.append(outcome)
        last: BaseException | None = None
        reason: str | None = None
        order = attempt_order(route, self._rng)
        for position, target in enumerate(order, 1):
            try:
                model = await _found(lookup(target))
            except SwitchyardError as exc:  # not loaded (or of another kind): the next one
                last = last or exc
                outcome.fallbacks.append((target, NOT_LOADED))
                self.stats.fallbacks[(name, target, NOT_LOADED)] += 1
                continue
            for retry in range(route.retries + 1):
                outcome.attempts += 1
                self.stats.attempts[name] += 1
                try:
                    result = await self._attempt(route, target, model, work)
                except Exception as exc:
                    reason = failure_reason(exc)
                    if reason is None:
                        raise
                    last = exc
                    if reason in route.retry_on and retry < route.retries:
                        self.stats.retries[(name, target, reason)] += 1
                        delay = backoff_delay(route.backoff, retry + 1, self._rng, retry_after(exc))
                        log.info("route %s: %s failed (%s); retry %d in %.2f s", name, target, reason, retry + 1, delay)
                        await self._sleep(delay)
                        continue
                    break
                outcome.model = target
                self.stats.served[(name, target)] += 1
                return result
            assert reason is not None
            if reason not in route.fallback_on or position == len(order):
                break
            outcome.fallbacks.append((target, reason))
            self.stats.fallbacks[(name, target, reason)] += 1
            log.info("route %s: %s failed (%s); falling back", name, target, reason)
        self.stats.failed[(name, reason or NOT_LOADED)] += 1
        if last is None:
            raise ServiceUnavailableError(f"route '{name}' has no model to try", headers={"Retry-After": "5"})
        raise last

    @staticmethod
    async def _attempt(route: Route, target: str, model: M, work: Callable[[M], Awaitable[T]]) -> T:
        if route.timeout_seconds is None:
            return await work(model)
        try:
            async with asyncio.timeout(route.timeout_seconds):
                return await work(model)
        except TimeoutError:
            raise GatewayTimeoutError(
                f"the model '{target}' did not answer within {route.timeout_seconds:g} s"
            ) from None


async def _found(model: M | Awaitable[M]) -> M:
    """A lookup's model: the registry's `get` gives it, its `acquire` (which loads a model on request) a coroutine."""
    return await model if inspect.isawaitable(model) else model
