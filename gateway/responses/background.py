"""Background responses (`background: true`): the answer is computed by a task while the client polls.

Until it finishes, a background response lives here (queued / in progress, cancellable); when it ends (completed,
incomplete, failed or cancelled) the service stores it and it leaves this table. A restart loses the responses
still running (they were never stored), as it loses any request in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Running:
    response: dict[str, Any]  # the Response object as GET shows it now
    task: asyncio.Task[None]


class BackgroundResponses:
    def __init__(self) -> None:
        self._running: dict[str, Running] = {}

    def start(self, response: dict[str, Any], work: Callable[[], Awaitable[None]]) -> None:
        """Run `work` (which stores the finished response) for `response`, queued until it starts."""

        async def run() -> None:
            try:
                response["status"] = "in_progress"
                await work()
            finally:
                self._running.pop(response["id"], None)

        self._running[response["id"]] = Running(response, asyncio.create_task(run()))

    def get(self, resp_id: str) -> dict[str, Any] | None:
        running = self._running.get(resp_id)
        return running.response if running is not None else None

    async def cancel(self, resp_id: str) -> bool:
        """Cancel a running response (its work stores it as cancelled); False when it is not running."""
        running = self._running.get(resp_id)
        if running is None:
            return False
        running.task.cancel()
        await asyncio.gather(running.task, return_exceptions=True)
        return True

    async def close(self) -> None:
        for running in list(self._running.values()):
            running.task.cancel()
        await asyncio.gather(*(r.task for r in self._running.values()), return_exceptions=True)
