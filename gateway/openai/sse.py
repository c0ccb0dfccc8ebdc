"""Server-sent events framing for /v1 streams: `data: {json}` events, in-stream errors, and `data: [DONE]`.

sse-starlette sends the events, pings idle streams with comment lines and notices client disconnects (which
cancels our generator and so aborts generation).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette.sse import EventSourceResponse

from gateway.errors import InternalError, SwitchyardError

log = logging.getLogger("switchyard.openai")

DONE = "[DONE]"


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


def sse_response(chunks: AsyncIterator[dict[str, Any]]) -> EventSourceResponse:
    return EventSourceResponse(_frames(chunks), sep="\n", ping=15, headers={"Cache-Control": "no-cache"})
