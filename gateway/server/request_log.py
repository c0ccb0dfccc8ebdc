"""Request ids and the log format.

Every HTTP request gets an id: the client's `X-Request-ID` when it is a sane token, else a fresh one. It is echoed
as `x-request-id`, attached to every log record written while the request is handled (`request_id`), and ends
the request's access-log line. `--log-format json` writes one JSON object per line for log shippers.
Headers are never logged (they carry API keys).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.http.ids import random_hex

_REQUEST_ID: ContextVar[str | None] = ContextVar("switchyard_request_id", default=None)
_VALID_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

access_log = logging.getLogger("switchyard.access")
QUIET_PATHS = frozenset({"/health", "/v2/health/live", "/v2/health/ready", "/metrics"})


def current_request_id() -> str | None:
    return _REQUEST_ID.get()


class RequestIdFilter(logging.Filter):
    """Adds `request_id` to every record (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = _REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in ("request_id", "method", "path", "status", "duration_ms"):
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None)
        return f"{line} [{request_id}]" if request_id else line


def setup_logging(level: str, fmt: str = "text") -> None:
    """Configure the root logger once for the process (uvicorn's own config is disabled)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


class RequestIdMiddleware:
    """Assigns the id, echoes it, and writes one access-log line per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        offered = dict(scope.get("headers", [])).get(b"x-request-id", b"").decode("latin-1")
        request_id = offered if _VALID_ID.fullmatch(offered) else random_hex()
        token = _REQUEST_ID.set(request_id)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            duration_ms = round((time.perf_counter() - started) * 1000, 1)
            path = scope.get("path", "")[:200]
            quiet = path in QUIET_PATHS and status < 400  # probes and scrapes every few seconds
            access_log.log(
                logging.DEBUG if quiet else logging.INFO,
                "%s %s %d %.1f ms",
                scope.get("method"),
                path,
                status,
                duration_ms,
                extra={"method": scope.get("method"), "path": path, "status": status, "duration_ms": duration_ms},
            )
            _REQUEST_ID.reset(token)
