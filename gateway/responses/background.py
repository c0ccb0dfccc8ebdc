"""Background responses (`background: true`): the answer is computed by a task while the client polls or streams.

Until it finishes, a background response lives here (queued / in progress, cancellable); when it ends (completed,
incomplete, failed or cancelled) the service stores it and it leaves this table. One created with `stream: true`
also keeps its events, so a client that lost the stream can follow it again from any sequence number
(`GET /v1/responses/{id}?stream=true&starting_after=N`) while it runs; the generation does not depend on any
client staying connected. A restart loses the responses still running (they were never stored), as it loses any
request in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import InvalidRequestError, NotFoundError


@dataclass
class Running:
    response: dict[str, Any]  # the Response object as GET shows it now
    owner: str  # the key that created it (see store.py)
    task: asyncio.Task[None] | None = None
    streamed: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)  # a streamed one's events so far
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # set on each new event and at the end
    done: bool = False


class BackgroundResponses:
    def __init__(self) -> None:
        self._running: dict[str, Running] = {}

    def start(self, response: dict[str, Any], owner: str, work: Callable[[], Awaitable[None]]) -> None:
        """Run `work` (which stores the finished response) for `response`, queued until it starts."""
        running = Running(response, owner)

        async def run() -> None:
            try:
                response["status"] = "in_progress"
                await work()
            finally:
                self._finish(running)

        running.task = asyncio.create_task(run())
        self._running[response["id"]] = running

    def start_stream(self, response: dict[str, Any], owner: str, events: AsyncIterator[dict[str, Any]]) -> None:
        """Run a streamed background response: its events are kept for followers; the last one's response (the
        events' generator stores it) becomes what GET shows."""
        running = Running(response, owner, streamed=True)

        async def run() -> None:
            try:
                async for event in events:
                    running.events.append(event)
                    if "response" in event:
                        response.update(event["response"])
                    running.changed.set()
            finally:
                self._finish(running)

        running.task = asyncio.create_task(run())
        self._running[response["id"]] = running

    def _finish(self, running: Running) -> None:
        running.done = True
        running.changed.set()
        self._running.pop(running.response["id"], None)

    def _find(self, resp_id: str, owner: str) -> Running | None:
        running = self._running.get(resp_id)
        return running if running is not None and running.owner == owner else None

    def get(self, resp_id: str, owner: str) -> dict[str, Any] | None:
        running = self._find(resp_id, owner)
        return running.response if running is not None else None

    async def follow(self, resp_id: str, owner: str, starting_after: int = -1) -> AsyncIterator[dict[str, Any]]:
        """A running streamed response's events after sequence number `starting_after`, until it ends."""
        running = self._find(resp_id, owner)
        if running is None:
            raise NotFoundError(
                f"No running background response with id '{resp_id[:64]}' to stream; GET it without stream.",
                param="response_id",
            )
        if not running.streamed:
            raise InvalidRequestError(
                "this response was not created with stream: true; GET it without stream", param="stream"
            )

        async def events() -> AsyncIterator[dict[str, Any]]:
            index = max(0, starting_after + 1)
            while True:
                running.changed.clear()
                while index < len(running.events):
                    yield running.events[index]
                    index += 1
                if running.done:
                    return
                await running.changed.wait()

        return events()

    async def cancel(self, resp_id: str, owner: str) -> bool:
        """Cancel a running response (its work stores it as cancelled); False when it is not running."""
        running = self._find(resp_id, owner)
        if running is None or running.task is None:
            return False
        running.task.cancel()
        await asyncio.gather(running.task, return_exceptions=True)
        return True

    async def close(self) -> None:
        tasks = [r.task for r in self._running.values() if r.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
