"""Whether a named key's request may start now: its budget for the period, then its requests and tokens per minute.

Per-minute limits are sliding windows of the last 60 seconds in one-second slots: a request is admitted while the
key's requests in the window are below its `rpm`, and while its tokens in the window plus what its requests in
flight and the new one are expected to produce fit in its `tpm`. Tokens are known only as a request runs, so they are
charged as they are produced; the expectation is the key's moving average of tokens per request, less what each
request in flight has produced so far. Without it, every request admitted just under the limit would add its whole
size on top, and a key with several requests in flight would run past its limit by as much. Over any span the
tokens admitted are the limit times the minutes, within the error of that average (a bucket refilled per minute
would also admit a first minute's burst). A key's windows are its own: one key at its limit never delays another.

Budgets count prompt + completion tokens (and cost, where prices are set) over a UTC calendar day or month; the
counts come from the usage ledger (`usage.py`), which sees every replica's usage through the shared database.
Refusals are 429 in OpenAI's shape with a Retry-After header: `rate_limit_exceeded` for a per-minute limit,
`insufficient_quota` for a spent budget (Retry-After: when the next period starts).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.errors import QuotaExceededError, RateLimitError
from gateway.keys.policy import KeyRecord, period_bounds

WINDOW_SECONDS = 60


class SlidingWindow:
    """Units taken in the last 60 seconds, in one-second slots."""

    __slots__ = ("_second", "_slots")

    def __init__(self) -> None:
        self._slots = [0.0] * WINDOW_SECONDS
        self._second: int | None = None  # the second the newest slot belongs to

    def _advance(self, now: float) -> int:
        second = math.floor(now)
        if self._second is None or second - self._second >= WINDOW_SECONDS:
            self._slots = [0.0] * WINDOW_SECONDS
        elif second > self._second:
            for passed in range(self._second + 1, second + 1):
                self._slots[passed % WINDOW_SECONDS] = 0.0
        else:
            second = self._second  # a clock that stepped back: count into the newest slot
        self._second = second
        return second

    def add(self, now: float, units: float) -> None:
        slot = self._advance(now) % WINDOW_SECONDS  # first: advancing may replace the slots
        self._slots[slot] += units

    def total(self, now: float) -> float:
        self._advance(now)
        return sum(self._slots)

    def wait(self, now: float, limit: float, units: float) -> float:
        """Seconds until `units` more fit under `limit` (0: they fit now)."""
        second = self._advance(now)
        excess = sum(self._slots) + units - limit
        if excess <= 0:
            return 0.0
        for age in range(WINDOW_SECONDS - 1, -1, -1):  # the oldest slot leaves the window first
            excess -= self._slots[(second - age) % WINDOW_SECONDS]
            if excess <= 0:
                return max(second - age + WINDOW_SECONDS - now, 0.001)
        return float(WINDOW_SECONDS)


@dataclass
class KeyWindows:
    """One key's windows, and its requests in flight (admitted while it had a `tpm`)."""

    requests: SlidingWindow = field(default_factory=SlidingWindow)
    tokens: SlidingWindow = field(default_factory=SlidingWindow)
    in_flight: int = 0
    in_flight_tokens: float = 0.0  # what the requests in flight have produced so far
    tokens_per_request: float = 0.0  # moving average over finished requests

    def expected(self, new: bool = False) -> float:
        """Tokens the requests in flight are still expected to produce (`new`: and one more request, at least 1)."""
        running = max(self.in_flight * self.tokens_per_request - self.in_flight_tokens, 0.0)
        return running + max(self.tokens_per_request, 1.0) if new else running


AVERAGE_WEIGHT = 0.2  # of the newest request in the moving average of tokens per request


class KeyLimiter:
    """The per-minute windows of every named key; `default_rpm`/`default_tpm` apply to keys that set none."""

    def __init__(self, default_rpm: int = 0, default_tpm: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.default_rpm = default_rpm
        self.default_tpm = default_tpm
        self._clock = clock
        self._windows: dict[str, KeyWindows] = {}

    def limits(self, key: KeyRecord) -> tuple[int, int]:
        """The key's (rpm, tpm); 0 = unlimited."""
        policy = key.policy
        return (
            self.default_rpm if policy.rpm is None else policy.rpm,
            self.default_tpm if policy.tpm is None else policy.tpm,
        )

    def windows(self, key_id: str) -> KeyWindows:
        windows = self._windows.get(key_id)
        if windows is None:
            windows = self._windows[key_id] = KeyWindows()
        return windows

    def admit(self, key: KeyRecord, used_tokens: int, used_cost: float, wall_now: float) -> None:
        """Count one request of `key`, or raise QuotaExceededError / RateLimitError (429, with Retry-After).
        An admitted request is in flight until `release`.

        `used_tokens`/`used_cost`: the key's usage in its current budget period (from the usage ledger)."""
        policy = key.policy
        spent = None
        if policy.budget_tokens is not None and used_tokens >= policy.budget_tokens:
            spent = f"its token budget of {policy.budget_tokens} per {policy.budget_period}"
        elif policy.budget_cost is not None and used_cost >= policy.budget_cost:
            spent = f"its cost budget of {policy.budget_cost:g} per {policy.budget_period}"
        if spent is not None:
            renew = max(1, math.ceil(period_bounds(policy.budget_period, wall_now)[1] - wall_now))
            raise QuotaExceededError(
                f"API key '{key.name}' has used {spent} (UTC); it renews in {renew} s",
                headers={"Retry-After": str(renew)},
            )
        rpm, tpm = self.limits(key)
        if not (rpm or tpm):
            return
        now = self._clock()
        state = self.windows(key.id)
        requests, tokens = state.requests, state.tokens
        for limit, window, units, what in (
            (rpm, requests, 1.0, "requests"),
            (tpm, tokens, state.expected(new=True), "tokens"),
        ):
            if limit:
                wait = window.wait(now, limit, units)
                if wait > 0:
                    retry = math.ceil(wait)
                    raise RateLimitError(
                        f"API key '{key.name}' reached its rate limit of {limit} {what} per minute "
                        f"(used {window.total(now):.0f}); retry in {retry} s",
                        headers={"Retry-After": str(retry)},
                    )
        if rpm:
            requests.add(now, 1.0)
        state.in_flight += 1

    def charge(self, key_id: str, tokens: int, in_flight: bool = True) -> None:
        """Tokens produced for `key_id`'s request (`in_flight`: one not yet released): they count against its
        tokens per minute."""
        if tokens > 0:
            state = self.windows(key_id)
            state.tokens.add(self._clock(), float(tokens))
            if in_flight:
                state.in_flight_tokens += tokens

    def release(self, key_id: str, tokens: int, sample: bool = True) -> None:
        """A request admitted for `key_id` ended, having produced `tokens` while in flight; `sample`: it was an
        inference request, whose size joins the average (a metadata read would drag it towards 0)."""
        state = self._windows.get(key_id)
        if state is None or state.in_flight <= 0:
            return
        state.in_flight -= 1
        state.in_flight_tokens = max(state.in_flight_tokens - float(tokens), 0.0)
        if not sample:
            return
        average = state.tokens_per_request
        state.tokens_per_request = float(tokens) if average == 0.0 else average + AVERAGE_WEIGHT * (tokens - average)

    def headers(self, key: KeyRecord) -> list[tuple[bytes, bytes]]:
        """OpenAI's `x-ratelimit-limit-*` and `x-ratelimit-remaining-*` response headers for the key's limits."""
        rpm, tpm = self.limits(key)
        if not (rpm or tpm):
            return []
        now, state = self._clock(), self.windows(key.id)
        out = []
        if rpm:
            left = max(rpm - int(state.requests.total(now)), 0)
            out += [(b"x-ratelimit-limit-requests", b"%d" % rpm), (b"x-ratelimit-remaining-requests", b"%d" % left)]
        if tpm:
            left = max(tpm - int(state.tokens.total(now) + state.expected()), 0)
            out += [(b"x-ratelimit-limit-tokens", b"%d" % tpm), (b"x-ratelimit-remaining-tokens", b"%d" % left)]
        return out

    def forget(self, key_id: str) -> None:
        """A revoked or deleted key's windows go."""
        self._windows.pop(key_id, None)
