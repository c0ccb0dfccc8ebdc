"""NDJSON streams: one object a line, an error line for an unexpected failure, and the generator closed (so its
work is aborted) however the stream ends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gateway.http.ndjson import NDJSONResponse


def _app(lines: AsyncIterator[dict[str, Any]]) -> TestClient:
    app = FastAPI()

    @app.get("/stream")
    async def stream() -> NDJSONResponse:
        return NDJSONResponse(lines, send_timeout_s=5)

    return TestClient(app)


def test_objects_go_one_a_line_and_the_generator_is_closed() -> None:
    closed: list[bool] = []

    async def lines() -> AsyncIterator[dict[str, Any]]:
        try:
            yield {"response": "Hi ✓", "done": False}
            yield {"response": "", "done": True, "vector": [0.5]}
        finally:
            closed.append(True)

    r = _app(lines()).get("/stream")
    assert r.headers["content-type"] == "application/x-ndjson"
    assert [orjson.loads(line) for line in r.text.splitlines()] == [
        {"response": "Hi ✓", "done": False},
        {"response": "", "done": True, "vector": [0.5]},
    ]
    assert r.text.endswith("\n") and closed == [True]


def test_an_unexpected_failure_ends_the_stream_with_an_error_line() -> None:
    async def lines() -> AsyncIterator[dict[str, Any]]:
        yield {"done": False}
        raise RuntimeError("/secret/path")

    body = _app(lines()).get("/stream").text.splitlines()
    assert orjson.loads(body[-1]) == {"error": "the stream failed; see the server log"} and len(body) == 2
