"""Name the field of a JSON body that is nested too deeply to parse.

Python's JSON parser gives up on bodies nested deeper than the interpreter's recursion limit (a 10k-level
`response_format` schema is a known attack) and FastAPI then answers a bare "error parsing the body". This route
class turns that into a 400 whose `param` names the top-level field at fault, found by a flat scan of the bytes.
It also refuses bodies holding an unpaired UTF-16 surrogate (`"\\ud800"`): Python's parser accepts them, but no
tokenizer or UTF-8 encoder does, so they would fail deep inside a request (or while rendering its error) as a 500.
And it answers 415 to a body sent as anything but JSON (form fields, pickle, msgpack, text), as vLLM's server does,
instead of FastAPI's validation error about a body that is not a dict: the message says which header to send.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.errors import InvalidRequestError, UnsupportedMediaTypeError

TOO_DEEP = 100  # the depth from which we blame a field; the parser itself fails near ~1000
PARSE_OFF_LOOP_BYTES = 256 * 1024  # bodies larger than this are parsed in a worker thread

# An escaped surrogate (\uD800-\uDFFF) or one encoded as UTF-8 bytes (which json.loads decodes with surrogatepass).
_SURROGATE_HINT = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_UNSET = object()


def has_lone_surrogate(raw: bytes, doc: Any = _UNSET) -> bool:
    """True when the JSON text `raw` (already parsed into `doc`, if given) holds an unpaired UTF-16 surrogate.
    A cheap scan of the bytes rules out almost every body; only suspects are checked in full."""
    if not _SURROGATE_HINT.search(raw) and not raw[:4].count(0) and not raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return False
    try:
        if doc is _UNSET:
            doc = json.loads(raw)
        json.dumps(doc, ensure_ascii=False).encode(
            "utf-8"
        )  # a surrogate pair was joined by the parser; a lone one fails
    except UnicodeEncodeError:
        return True
    except (ValueError, RecursionError):  # not JSON at all: the parser reports that itself
        return False
    return False


async def _read_body(request: Request) -> bytes | bytearray:
    """The whole body. A large one declared by Content-Length is written into one buffer of that size as it
    arrives, instead of being joined from its pieces at the end (a copy of megabytes while the event loop waits)."""
    declared = request.headers.get("content-length", "")
    if not declared.isdigit() or int(declared) <= PARSE_OFF_LOOP_BYTES:
        return await request.body()
    buffer = bytearray(int(declared))
    view, filled = memoryview(buffer), 0
    async for chunk in request.stream():
        view[filled : filled + len(chunk)] = chunk  # the server enforces Content-Length: it never runs over
        filled += len(chunk)
    view.release()
    del buffer[filled:]
    request._body = buffer  # Starlette's cache of request.body(), for FastAPI and anything after us
    return buffer


def _lone_surrogate_in(doc: Any) -> bool:
    """Whether any string (key or value) of a parsed JSON document holds an unpaired surrogate."""
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():  # constant time: CPython keeps the flag
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _parse(raw: bytes | bytearray) -> tuple[bool, Any]:
    """(whether `raw` holds a lone surrogate, the parsed document or _UNSET when it does not parse: FastAPI then
    parses it again and reports the error as usual)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return False, _UNSET
    return _lone_surrogate_in(doc), doc


def deepest_field(raw: bytes, limit: int = TOO_DEEP) -> str | None:
    """The top-level key whose value first nests deeper than `limit` (no recursion, one pass)."""
    depth, in_string, escaped = 0, False, False
    string_start, last_string, key = 0, "", None
    for i, byte in enumerate(raw):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # closing quote
                in_string = False
                last_string = raw[string_start:i].decode("utf-8", "replace")
            continue
        if byte == 0x22:
            in_string, string_start = True, i + 1
        elif byte == 0x3A and depth == 1:  # ':' after a top-level key
            key = last_string
        elif byte in (0x7B, 0x5B):  # { [
            depth += 1
            if depth > limit:
                return key
        elif byte in (0x7D, 0x5D):
            depth -= 1
    return None


def json_media_type(content_type: str | None) -> bool:
    """Whether FastAPI reads a body with this Content-Type as JSON: none given, application/json or
    application/*+json (parameters such as charset aside)."""
    if not content_type:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class NestingAwareRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            if request.method in ("POST", "PUT", "PATCH"):
                content_type = request.headers.get("content-type")
                if not json_media_type(content_type):
                    media = content_type.split(";", 1)[0].strip()[:64]
                    raise UnsupportedMediaTypeError(
                        f"Content-Type '{media}' is not supported: send the body as JSON with the header "
                        "'Content-Type: application/json'"
                    )
                try:
                    raw = await _read_body(request)
                except ClientDisconnect:
                    raise InvalidRequestError("the client closed the connection before the body ended") from None
                if len(raw) > PARSE_OFF_LOOP_BYTES:
                    # Megabytes of JSON held the event loop for a second (a regex scan, the parse): health probes
                    # and streams waited. Parse in a thread (FastAPI reuses the result) and look for lone
                    # surrogates in the parsed strings, where an ASCII string is ruled out in constant time.
                    surrogate, doc = await asyncio.to_thread(_parse, raw)
                    if doc is not _UNSET:
                        request._json = doc  # Starlette's cache of request.json(), which FastAPI reads the body from
                else:
                    surrogate = has_lone_surrogate(raw)
                if surrogate:
                    raise InvalidRequestError(
                        "the request body is not valid JSON: it holds an unpaired UTF-16 surrogate"
                    )
            try:
                return await handler(request)
            except HTTPException as exc:
                if not isinstance(exc.__cause__, RecursionError):
                    raise
                field = deepest_field(await request.body())
                where = f"'{field[:64]}'" if field else "the request body"
                param = field[:64] if field else None
                raise InvalidRequestError(f"{where} is nested too deeply", param=param) from None

        return route
