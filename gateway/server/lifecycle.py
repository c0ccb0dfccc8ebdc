"""Graceful shutdown: SIGTERM drains instead of dropping work.

On SIGTERM (or SIGINT) the server turns not-ready and answers new requests with 503 + `Retry-After`, so a load
balancer or Kubernetes sends them elsewhere, while the requests already admitted run to the end. When none is
left, or when the grace period is over, uvicorn closes the listeners and the process exits 0. A second signal
exits at once.

uvicorn's own handling is not enough: it drops new requests on kept-alive connections without an answer in the
protocol's shape, and it re-raises the signal after shutdown, so the process exits 143 instead of 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from types import FrameType

import uvicorn

log = logging.getLogger("switchyard.lifecycle")


class InFlightCount:
    """Requests running somewhere (the whole server, or one model copy), and a way to wait until none is."""

    def __init__(self) -> None:
        self.count = 0
        self._idle: asyncio.Event | None = None

    def enter(self) -> None:
        self.count += 1

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0 and self._idle is not None:
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no request runs (call after new ones are refused, so the count only goes down)."""
        while self.count > 0:
            self._idle = asyncio.Event()
            await self._idle.wait()


class Lifecycle(InFlightCount):
    """The server's requests in flight, and whether it is draining."""

    def __init__(self) -> None:
        super().__init__()
        self.draining = False

    async def drain(self, grace_seconds: float) -> bool:
        """Stop admitting and wait for in-flight requests; True if they all finished within the grace period."""
        self.draining = True
        if self.count == 0:
            return True
        try:
            await asyncio.wait_for(self.wait_idle(), timeout=grace_seconds)
            return True
        except TimeoutError:
            return False


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain before shutdown and exit code 0 after a signal."""

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle, grace_seconds: float) -> None:
        super().__init__(config)
        self._lifecycle = lifecycle
        self._grace = grace_seconds
        self._drain_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not calling super(): it records the signal to re-raise it after shutdown (exit 143).
        if self._drain_task is not None or self.should_exit:
            log.warning("second %s: exiting without waiting", signal.Signals(sig).name)
            self.should_exit = self.force_exit = True
            return
        loop = asyncio.get_event_loop()
        self._drain_task = loop.create_task(self._drain(signal.Signals(sig).name))

    async def _drain(self, name: str) -> None:
        started = time.monotonic()
        log.info("%s: draining %d request(s) in flight (grace %.0f s)", name, self._lifecycle.count, self._grace)
        finished = await self._lifecycle.drain(self._grace)
        if finished:
            log.info("drained in %.1f s; shutting down", time.monotonic() - started)
        else:
            log.warning("grace period over with %d request(s) in flight; shutting down", self._lifecycle.count)
        self.should_exit = True
