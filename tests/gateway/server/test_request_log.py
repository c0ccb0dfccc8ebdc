"""Request ids: taken from a sane X-Request-ID or made up, echoed, attached to log records; JSON log lines."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway.server.request_log import JsonFormatter, RequestIdFilter, RequestIdMiddleware, current_request_id


def _app() -> RequestIdMiddleware:
    async def hello(request):
        logging.getLogger("switchyard.test").info("handling")
        return PlainTextResponse(current_request_id() or "")

    return RequestIdMiddleware(Starlette(routes=[Route("/hello", hello)]))


@pytest.fixture
def records(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    caplog.handler.addFilter(RequestIdFilter())
    return caplog


async def test_sane_ids_are_kept_and_echoed(records: pytest.LogCaptureFixture) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()), base_url="http://t") as client:
        resp = await client.get("/hello", headers={"X-Request-ID": "abc-123"})
    assert resp.headers["x-request-id"] == "abc-123" and resp.text == "abc-123"
    handling = [r for r in records.records if r.getMessage() == "handling"]
    assert handling[0].request_id == "abc-123"
    access = [r for r in records.records if r.name == "switchyard.access"]
    assert access[0].status == 200 and access[0].path == "/hello" and access[0].request_id == "abc-123"


@pytest.mark.parametrize("offered", ["", "has space", "x" * 129, 'quote"', "new\nline"])
async def test_other_ids_are_replaced(offered: str) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()), base_url="http://t") as client:
        resp = await client.get("/hello", headers={"X-Request-ID": offered} if "\n" not in offered else {})
    assert resp.headers["x-request-id"] != offered and len(resp.headers["x-request-id"]) == 32


def test_json_formatter() -> None:
    record = logging.LogRecord("switchyard.x", logging.WARNING, __file__, 1, "hello %s", ("world",), None)
    record.request_id = "r1"
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "hello world" and entry["level"] == "warning" and entry["request_id"] == "r1"
    assert entry["logger"] == "switchyard.x" and entry["time"].endswith("Z")
