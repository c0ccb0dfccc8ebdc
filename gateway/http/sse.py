"""Server-sent events framing for /v1 streams: `data: {json}` events, in-stream errors, and `data: [DONE]`.

sse-starlette sends the events, pings idle streams with comment lines and notices client disconnects (which
cancels our generator and so aborts generation). A client that stops reading (its socket buffers full) has its
stream closed, and so its generation aborted, once one send has waited the server's `stream_send_timeout_secs`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from sse_starlette.sse import EventSourceResponse, SendTimeoutError
from starlette.types import Receive, Scope, Send

from gateway.errors import InternalError, SwitchyardError

log = logging.getLogger("switchyard.openai")

DONE = "[DONE]"


class EventStream(EventSourceResponse):
    """An SSE response (also used by /v2 generate_stream) that gives up on clients that stopped reading."""

    def __init__(self, events: AsyncIterator[Any], send_timeout_s: float) -> None:
        """`send_timeout_s`: how long one send may wait for a client that does not read (ServerConfig)."""
        super().__init__(events, sep="\n", ping=15, send_timeout=send_timeout_s, headers={"Cache-Control": "no-cache"})
        self._send_timeout_s = send_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except SendTimeoutError:  # the events' generator was closed (aborting the work); drop the connection
            log.warning("closed a stream whose client stopped reading for %.0f s", self._send_timeout_s)


def _dump(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


async def _frames(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, str]]:
    try:
        async for chunk in chunks:
            yield {"data": _dump(chunk)}
    except SwitchyardError as exc:
        yield {"data": _dump(exc.openai_body())}
    except Exception:
        log.exception("stream failed after it started")
        yield {"data": _dump(InternalError("the stream failed; see the server log").openai_body())}
    yield {"data": DONE}


def sse_response(chunks: AsyncIterator[dict[str, Any]], send_timeout_s: float) -> EventSourceResponse:
    return EventStream(_frames(chunks), send_timeout_s)


async def _typed_frames(
    events: AsyncIterator[dict[str, Any]], failure: Callable[[SwitchyardError], dict[str, Any]]
) -> AsyncIterator[dict[str, str]]:
    try:
        async for event in events:
            yield {"event": event["type"], "data": _dump(event)}
    except SwitchyardError as exc:  # ours, in words (a full disk under the Responses store): said as it is
        yield {"event": "error", "data": _dump(failure(exc))}
    except Exception:
        log.exception("stream failed after it started")
        yield {"event": "error", "data": _dump(failure(InternalError("the stream failed; see the server log")))}


def typed_events_response(
    events: AsyncIterator[dict[str, Any]], send_timeout_s: float, failure: Callable[[SwitchyardError], dict[str, Any]]
) -> EventSourceResponse:
    """Events named by their `type` (`event: <type>` then `data: {json}`), as the Responses and Messages APIs
    stream them; an unexpected failure sends an `error` event with the body `failure` gives."""
    return EventStream(_typed_frames(events, failure), send_timeout_s)
