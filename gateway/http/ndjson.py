"""Newline-delimited JSON streams (`application/x-ndjson`): one JSON object a line, as Ollama's API streams.

The objects' generator is closed however the stream ends (the client went away, a send waited too long, the last
line was sent), so the work behind it (a generation) is aborted at once rather than when the generator is
collected. A client that stops reading has its stream closed once one send has waited `send_timeout_s`. A failure
the generator does not turn into a line itself ends the stream with `{"error": "..."}`, the in-stream error shape
of NDJSON APIs.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import orjson
from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse
from starlette.types import Send

log = logging.getLogger("switchyard")

MEDIA_TYPE = "application/x-ndjson"


def ndjson_line(obj: dict[str, Any]) -> bytes:
    """One object as a line (numpy arrays written directly, non-ASCII kept)."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE)


class NDJSONResponse(StreamingResponse):
    """Streams the objects `lines` yields, one a line; `background` runs once the stream has ended."""

    def __init__(
        self, lines: AsyncIterator[dict[str, Any]], send_timeout_s: float, background: BackgroundTask | None = None
    ) -> None:
        # the lines are sent by stream_response below, not by the parent's body iterator
        super().__init__((), media_type=MEDIA_TYPE, headers={"Cache-Control": "no-cache"}, background=background)
        self._lines = lines
        self._send_timeout_s = send_timeout_s

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            try:
                async for obj in self._lines:
                    await self._send(send, ndjson_line(obj))
            except TimeoutError:
                log.warning("closed a stream whose client stopped reading for %.0f s", self._send_timeout_s)
                return
            except OSError:  # the client went away (Starlette reports it)
                raise
            except Exception:
                log.exception("stream failed after it started")
                await self._send(send, ndjson_line({"error": "the stream failed; see the server log"}))
        finally:
            with anyio.CancelScope(shield=True):  # a cancelled stream (client gone) still aborts its work
                await self._lines.aclose()  # type: ignore[attr-defined]
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send(self, send: Send, body: bytes) -> None:
        with anyio.fail_after(self._send_timeout_s):
            await send({"type": "http.response.body", "body": body, "more_body": True})
