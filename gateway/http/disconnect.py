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


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        # The body has been read, so the server's next message is the disconnect: wait for it rather than poll
        # (polling costs each waiting request a wake-up every few hundred ms, which adds up at high concurrency).
        while (await request.receive())["type"] != "http.disconnect":
            pass

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
