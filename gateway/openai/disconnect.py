"""Abort non-streaming work when its client goes away.

Starlette does not cancel a handler when the client disconnects, so generation would run to the end for
nobody. We race the handler's work against a watcher of `http.disconnect`; cancelling the work closes the
engine streams, which aborts the requests at the next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

from gateway.errors import SwitchyardError

T = TypeVar("T")


class ClientDisconnected(SwitchyardError):
    status = 499
    type = "client_closed_request"
    code = "client_closed_request"


async def cancel_on_disconnect(request: Request, work: Awaitable[T], poll_seconds: float = 0.25) -> T:
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(poll_seconds)

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientDisconnected("the client closed the connection")
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
