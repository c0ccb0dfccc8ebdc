"""`OpenAIUpstream`: a `PassthroughEngine` over one OpenAI-compatible server (Ollama, LM Studio, llama.cpp's
`llama-server`, vLLM, another Switchyard, a cloud API).

Bodies go out as the client sent them (the gateway only sets `model` to the upstream's name and asks streams for
their usage), answers come back parsed. One aiohttp session per model holds the connection pool (keep-alive, at
most `max_connections` open); aiohttp, not httpx, for the reason the remote engine gives (a third of the CPU per
streamed token, on a gateway that shares its machine). The API key is sent as `Authorization: Bearer` and
appears nowhere else: not in logs, errors, `repr` or `/v1/models`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from engines.interface import PassthroughEngine, UpstreamError, UpstreamTimeoutError, UpstreamUnreachableError
from engines.remote.engine import _drain, _lines  # the SSE line reader the remote engine uses, shared
from engines.types import EngineInfo

log = logging.getLogger("switchyard.engines.passthrough")

MAX_ERROR_CHARS = 300
MAX_BODY_BYTES = 64 << 20  # a JSON answer larger than this is not one an OpenAI-compatible server sends
TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux only


@dataclass(frozen=True)
class PassthroughSettings:
    """Where the upstream is, the name it serves the model under, its key and how long to wait for it."""

    base_url: str  # the OpenAI base URL, `/v1` included (as the openai SDK's base_url)
    model: str
    api_key: str | None = field(default=None, repr=False)
    connect_timeout: float = 5.0
    read_timeout: float = 600.0  # each piece of an answer, the first token included
    max_connections: int = 64  # the pool's bound; the admission scheduler bounds requests in flight before it

    @property
    def root(self) -> str:
        """The base URL without a trailing slash; a URL without a path gets `/v1` (`http://host:8080`)."""
        url = self.base_url.rstrip("/")
        return url if urlsplit(url).path else url + "/v1"


def _error(status: int, raw: bytes, retry_after: str | None) -> UpstreamError:
    """The upstream's error answer as an `UpstreamError`, with its message (OpenAI's shape, FastAPI's `detail`,
    Ollama's and llama.cpp's `error` string) cut short."""
    message, param, code, kind = f"HTTP {status}", None, None, None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        text = raw.decode("utf-8", "replace").strip()
        message = text[:MAX_ERROR_CHARS] or message
    else:
        err = obj.get("error") if isinstance(obj, dict) else None
        if isinstance(err, dict):
            message = str(err.get("message") or message)
            param = err.get("param") if isinstance(err.get("param"), str) else None
            code = str(err["code"]) if err.get("code") is not None else None
            kind = err.get("type") if isinstance(err.get("type"), str) else None
        elif isinstance(obj, dict) and (err or obj.get("detail") or obj.get("message")):
            message = str(err or obj.get("detail") or obj.get("message"))
    seconds = None
    if retry_after is not None:
        with contextlib.suppress(ValueError):
            seconds = max(0.0, float(retry_after))
    return UpstreamError(status, message[:MAX_ERROR_CHARS], param=param, code=code, type=kind, retry_after=seconds)


async def _body(resp: aiohttp.ClientResponse) -> bytes:
    """The whole body, bounded: an answer past MAX_BODY_BYTES fails instead of filling the gateway's memory."""
    parts, size = [], 0
    async for data in resp.content.iter_chunked(1 << 16):
        size += len(data)
        if size > MAX_BODY_BYTES:
            raise UpstreamError(502, f"the upstream's answer is larger than {MAX_BODY_BYTES >> 20} MiB")
        parts.append(data)
    return b"".join(parts)


def _ack_at_once(resp: aiohttp.ClientResponse) -> None:
    """ACK what the upstream sends as it is read, for the rest of this answer (Linux's TCP_QUICKACK).

    Servers that leave Nagle's algorithm on (llama.cpp's `llama-server`, through cpp-httplib) write a stream's
    headers and its first chunk in two sends, and the second waits until the first is acknowledged. The gateway
    has just sent its request on a kept-alive connection, so its kernel delays that ACK (up to 40 ms: it expects
    to answer with data), and the first token waits with it (bench/passthrough_overhead.py: +48 ms against a
    stand-in that writes so, +4 ms with this). Quick ACKs last until the gateway sends again on the connection."""
    connection = resp.connection
    sock = connection.transport.get_extra_info("socket") if connection and connection.transport else None
    if TCP_QUICKACK is not None and sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, TCP_QUICKACK, 1)


def _transport(exc: BaseException, root: str) -> Exception:
    """A transport failure as the contract's error; the message names the upstream, never its key."""
    what = exc.__class__.__name__ + (f": {exc}" if str(exc) else "")
    if isinstance(exc, TimeoutError):  # aiohttp's connect and read timeouts are TimeoutErrors
        return UpstreamTimeoutError(f"{root} did not answer in time ({what[:MAX_ERROR_CHARS]})")
    return UpstreamUnreachableError(f"{root} failed ({what[:MAX_ERROR_CHARS]})")


class OpenAIUpstream(PassthroughEngine):
    def __init__(self, settings: PassthroughSettings, info: EngineInfo) -> None:
        self._settings = settings
        self._info = info
        self._root = settings.root
        self._headers = {"Content-Type": "application/json"}
        if settings.api_key:
            self._headers["Authorization"] = f"Bearer {settings.api_key}"
        self._client: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def upstream_model(self) -> str:
        return self._settings.model

    async def start(self) -> None:
        s = self._settings
        # No bound on a whole answer (a long generation is fine); each read waits at most read_timeout.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=s.connect_timeout, sock_read=s.read_timeout)
        self._client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=s.max_connections),
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=timeout,
            raise_for_status=False,
        )
        # Retries of a request whose pooled connection the upstream had closed: each on a connection of its own.
        self._fresh = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True),
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=timeout,
            raise_for_status=False,
        )

    async def shutdown(self) -> None:
        for client in (self._client, self._fresh):
            if client is not None:
                await client.close()

    @contextlib.asynccontextmanager
    async def _post(
        self, endpoint: str, body: dict[str, Any], headers: dict[str, str]
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST to the upstream. A kept-alive connection the upstream closed while idle (llama.cpp's server closes
        one after each streamed answer without saying so) fails as it is used, before anything is answered: the
        request is sent once more, on a new connection. So is one whose connection is reset while the request is being
        written (the upstream closed it with data unread)."""
        if self._client is None or self._fresh is None:
            raise UpstreamUnreachableError("the upstream's connection pool is not open (the model is not started)")
        url, data, headers = f"{self._root}/{endpoint}", orjson.dumps(body), {**headers, **self._headers}
        try:
            resp = await self._client.post(url, data=data, headers=headers)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if isinstance(exc, aiohttp.ClientConnectorError):  # no connection at all: nothing to retry
                raise
            # closed while idle (ServerDisconnectedError) or reset while the request was being written (OSError:
            # "Can not write request body"): nothing was answered, so the request is sent once more
            resp = await self._fresh.post(url, data=data, headers=headers)
        async with resp:
            _ack_at_once(resp)
            yield resp

    async def request(self, endpoint: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        try:
            async with self._post(endpoint, body, headers) as resp:
                raw = await _body(resp)
                if resp.status != 200:
                    raise _error(resp.status, raw, resp.headers.get("Retry-After"))
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _transport(exc, self._root) from None
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            raise UpstreamError(502, "the upstream's answer is not a JSON object")
        return answer

    async def stream(
        self, endpoint: str, body: dict[str, Any], headers: dict[str, str]
    ) -> AsyncIterator[dict[str, Any]]:
        try:
            async with self._post(endpoint, body, headers) as resp:
                if resp.status != 200:
                    raise _error(resp.status, await _body(resp), resp.headers.get("Retry-After"))
                lines = _lines(resp)
                async for line in lines:
                    if not line.startswith("data:"):
                        continue  # event names, comments (keep-alive pings), blank separators
                    data = line[5:].strip()
                    if data == "[DONE]":
                        await _drain(lines)
                        return
                    try:
                        chunk = orjson.loads(data)
                    except orjson.JSONDecodeError:
                        raise UpstreamError(502, "the upstream sent a chunk that is not JSON") from None
                    if not isinstance(chunk, dict):
                        raise UpstreamError(502, "the upstream sent a chunk that is not a JSON object")
                    if "error" in chunk and "choices" not in chunk:  # an error event inside the stream
                        raise _error(500, data.encode(), None)
                    yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _transport(exc, self._root) from None


def probe_max_model_len(settings: PassthroughSettings, timeout: float = 3.0) -> int | None:
    """The model's context length from the upstream's `GET /models` (vLLM and Switchyard list `max_model_len`),
    or None. Blocking and best effort: it runs once while the model loads, and an upstream that is down then is
    no reason to fail the load."""
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    ask = urllib.request.Request(f"{settings.root}/models", headers=headers)
    try:
        with urllib.request.urlopen(ask, timeout=timeout) as resp:  # a URL from config, never from a request
            entries = json.loads(resp.read(MAX_BODY_BYTES)).get("data") or []
    except (OSError, urllib.error.URLError, ValueError, AttributeError) as exc:
        log.warning(
            "could not list the models of %s (%s); the context length stays unknown",
            settings.root,
            exc.__class__.__name__,
        )
        return None
    for entry in entries:
        if isinstance(entry, dict) and entry.get("id") == settings.model:
            value = entry.get("max_model_len")
            return value if isinstance(value, int) and value > 0 else None
    names = [e.get("id") for e in entries if isinstance(e, dict)][:20]
    log.warning("upstream %s does not list model '%s' (it lists %s)", settings.root, settings.model, names)
    return None


def build_passthrough_engine(settings: PassthroughSettings, max_model_len: int | None) -> OpenAIUpstream:
    """The engine for one model (blocking: asks the upstream for the context length when the config omits it)."""
    if max_model_len is None:
        max_model_len = probe_max_model_len(settings)
    info = EngineInfo(
        model_type="openai", dtype="upstream", max_model_len=max_model_len or 0, vocab_size=0, eos_token_ids=[]
    )
    log.info("model '%s' is served as it is by %s", settings.model, settings.root)
    return OpenAIUpstream(settings, info)
