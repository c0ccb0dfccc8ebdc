"""One request's use of models: its deadline, and the models it holds until its response has been sent.

Why: a model loaded on demand must not be evicted between the moment a request looks it up and the moment its
engine starts counting the request (tokenizing, rendering the prompt and queueing come in between), nor while its
stream is still being sent. `ModelUseMiddleware` opens a `ModelUse` for every HTTP request; the on-demand loader
(`on_demand.py`) adds a hold on each model the request looks up, and the middleware lets them all go once the
response is complete. The gRPC server opens one per call with the call's deadline.

The deadline bounds how long a request waits for its model to load: the client's own timeout where it says it
(the OpenAI and Anthropic SDKs send theirs as `X-Stainless-Timeout` / `X-Stainless-Read-Timeout`, in seconds;
any client may send `X-Request-Timeout`), the gRPC deadline, else the server's `--load-timeout-secs`.
"""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Callable
from typing import Any

#: Headers that carry the client's timeout in seconds, first found wins.
TIMEOUT_HEADERS = (b"x-request-timeout", b"x-stainless-read-timeout", b"x-stainless-timeout")


class ModelUse:
    """The models one request holds, and when it stops waiting (`deadline`: time.monotonic(), or None)."""

    def __init__(self, deadline: float | None = None) -> None:
        self.deadline = deadline
        self._releases: list[Callable[[], None]] = []
        self.closed = False

    def hold(self, release: Callable[[], None]) -> None:
        """Keep a model until the request ends; at once if it has ended (a task it started that lives on)."""
        if self.closed:
            release()
        else:
            self._releases.append(release)

    def release(self) -> None:
        self.closed = True
        releases, self._releases = self._releases, []
        for release in releases:
            release()


_CURRENT: contextvars.ContextVar[ModelUse | None] = contextvars.ContextVar("switchyard_model_use", default=None)


def current_use() -> ModelUse | None:
    return _CURRENT.get()


def open_use(deadline: float | None = None) -> contextvars.Token[ModelUse | None]:
    """Start a request's use (gRPC calls; HTTP requests get theirs from the middleware); close with `close_use`."""
    return _CURRENT.set(ModelUse(deadline))


def close_use(token: contextvars.Token[ModelUse | None]) -> None:
    use = _CURRENT.get()
    _CURRENT.reset(token)
    if use is not None:
        use.release()


def header_deadline(headers: list[tuple[bytes, bytes]], now: float | None = None) -> float | None:
    """The deadline a request's timeout header sets, or None (absent, or not a positive number of seconds)."""
    wanted = dict(headers)
    for name in TIMEOUT_HEADERS:
        raw = wanted.get(name)
        if raw is None:
            continue
        try:
            seconds = float(raw.decode("latin-1").strip())
        except ValueError:
            continue
        if seconds > 0 and math.isfinite(seconds):
            return (time.monotonic() if now is None else now) + seconds
    return None


class ModelUseMiddleware:
    """Opens a `ModelUse` for each HTTP request and releases its models once the response has been sent."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = open_use(header_deadline(scope.get("headers") or []))
        try:
            await self.app(scope, receive, send)
        finally:
            close_use(token)
