"""The request body limit: the server's, and a route's own where it takes larger bodies (file uploads)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.http.body_limit import BodyLimitMiddleware


async def _size(request: Request) -> JSONResponse:
    return JSONResponse({"bytes": len(await request.body())})


def _client() -> TestClient:
    app = Starlette(routes=[Route("/v1/files", _size, methods=["POST"]), Route("/v1/other", _size, methods=["POST"])])
    app.add_middleware(BodyLimitMiddleware, max_bytes=1024, path_limits={"/v1/files": 4096})
    return TestClient(app)


def test_a_route_with_its_own_limit_takes_larger_bodies() -> None:
    client = _client()
    assert client.post("/v1/files", content=b"x" * 4096).json() == {"bytes": 4096}
    refused = client.post("/v1/other", content=b"x" * 1025)
    assert refused.status_code == 413 and "1024 bytes" in refused.json()["error"]["message"]
    too_large = client.post("/v1/files", content=b"x" * 4097)
    assert too_large.status_code == 413 and "4096 bytes" in too_large.json()["error"]["message"]


def test_a_body_without_a_length_is_bounded_while_it_streams() -> None:
    def chunks(count: int):  # noqa: ANN202 - a generator body: sent chunked, without Content-Length
        for _ in range(count):
            yield b"x" * 1024

    client = _client()
    assert client.post("/v1/files", content=chunks(4)).json() == {"bytes": 4096}
    assert client.post("/v1/files", content=chunks(5)).status_code == 413
