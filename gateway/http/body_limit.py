"""ASGI middleware that bounds request bodies before any parsing happens.

A declared Content-Length over the limit is refused at once (413); a missing or lying one is enforced while the
body streams in, so chunked uploads cannot exceed the limit either. Malformed lengths get 400. A route that takes
larger bodies by design (file uploads) has its own limit in `path_limits`.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import InvalidRequestError, PayloadTooLargeError, SwitchyardError, error_body


class _TooLarge(Exception):
    pass


async def send_error(scope: Scope, send: Send, error: SwitchyardError) -> None:
    payload = json.dumps(error_body(scope.get("path", ""), error)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int, path_limits: dict[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.path_limits = path_limits or {}  # exact path -> its own limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.path_limits.get(scope.get("path", ""), self.max_bytes)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None:
            text = declared.decode("latin-1").strip()
            if not text.isdigit():
                await send_error(scope, send, InvalidRequestError("invalid Content-Length header"))
                return
            if int(text) > limit:
                await send_error(scope, send, self._too_large(limit))
                return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await send_error(scope, send, self._too_large(limit))

    @staticmethod
    def _too_large(limit: int) -> PayloadTooLargeError:
        return PayloadTooLargeError(f"request body exceeds the limit of {limit} bytes")
