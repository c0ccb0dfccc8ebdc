"""uvicorn's httptools protocol with a bound on each request's head (request line + headers).

httptools has no limit of its own: a client could send megabytes of headers (buffered, and concatenated
quadratically while one header value is still arriving) before the app sees anything. Past `MAX_HEAD_BYTES` the
request gets a 431 in the protocol's error shape and the connection is closed.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("switchyard")

MAX_HEAD_BYTES = 64 * 1024


class _HeadTooLarge(Exception):
    pass


class BoundedHeadHttpToolsProtocol(HttpToolsProtocol):
    max_head_bytes = MAX_HEAD_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # the current request's headers are still arriving
        self._raw_head_bytes = 0  # bytes received while in the head (catches one endless header value)
        self._head_bytes = 0  # parsed url + header bytes of the current request
        self._head_too_large = False

    # -- counting -------------------------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._head_too_large or self.transport.is_closing():
            return
        if self._in_head:
            self._raw_head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._raw_head_bytes > self.max_head_bytes and not self.transport.is_closing():
            self._head_too_large = True
            self.send_400_response("")

    def _count(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.max_head_bytes:
            self._head_too_large = True
            raise _HeadTooLarge  # httptools turns it into a parser error; uvicorn then calls send_400_response

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._count(len(name) + len(value) + 4)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._raw_head_bytes = True, 0

    # -- the refusal ----------------------------------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        if not self._head_too_large:
            super().send_400_response(msg)
            return
        message = f"the request line and headers exceed the limit of {self.max_head_bytes} bytes"
        log.warning("refused a request whose head exceeds %d bytes", self.max_head_bytes)
        if bytes(getattr(self, "url", b"") or b"").startswith(b"/v2"):
            body: dict[str, Any] = {"error": message}
        else:
            body = {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "request_header_fields_too_large",
                }
            }
        payload = json.dumps(body).encode()
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(payload)).encode() + b"\r\nconnection: close\r\n\r\n" + payload
        )
        self.transport.close()
