"""Route decisions, pure and synchronous (the runner acts on them): which models to try in which order, whether a
failure falls back or is retried, and how long to wait before a retry. Randomness comes from the caller's
`random.Random`, so tests fix it."""

from __future__ import annotations

import random

from gateway.errors import GatewayTimeoutError, SwitchyardError, UpstreamConnectionError
from gateway.routes.config import Backoff, Reason, Route


def attempt_order(route: Route, rng: random.Random) -> list[str]:
    """The models to try, first choice first. `weighted`: each next one drawn by weight from those not yet drawn
    (so the first is split by weight, and a fallback goes to the others in proportion too)."""
    if route.strategy == "ordered":
        return [t.model for t in route.targets]
    left = list(route.targets)
    order = []
    while left:
        pick = rng.choices(range(len(left)), weights=[t.weight for t in left])[0]
        order.append(left.pop(pick).model)
    return order


def failure_reason(error: BaseException) -> Reason | None:
    """The failure's reason for `fallback_on` and `retry_on`, or None when it is the client's (a 4xx other than
    429: the next model would refuse it as well) or not a model's failure at all."""
    if isinstance(error, (TimeoutError, GatewayTimeoutError)):
        return "timeout"
    if isinstance(error, UpstreamConnectionError):
        return "connect"
    if isinstance(error, SwitchyardError):
        if error.status == 429:
            return "429"
        if error.status >= 500:
            return "5xx"
    return None


def retry_after(error: BaseException) -> float | None:
    """The Retry-After (seconds) a failure carries, if any."""
    headers = getattr(error, "headers", None) or {}
    try:
        return float(headers["Retry-After"]) if "Retry-After" in headers else None
    except ValueError:
        return None


def backoff_delay(backoff: Backoff, retry: int, rng: random.Random, after: float | None = None) -> float:
    """Seconds to wait before retry number `retry` (1 for the first): exponential, capped, jittered; a longer
    Retry-After from the model wins, within the cap."""
    base = min(backoff.max_seconds, backoff.initial_seconds * backoff.multiplier ** (retry - 1))
    delay = base * (1 + backoff.jitter * (2 * rng.random() - 1))
    if after is not None:
        delay = max(delay, after)
    return max(0.0, min(delay, backoff.max_seconds))
