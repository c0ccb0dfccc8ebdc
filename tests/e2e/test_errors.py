"""Every error is OpenAI-shaped, with the right status and `param`; the server keeps serving."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.conftest import DEFAULT_MODEL

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def http(base_url: str):
    with httpx.Client(base_url=base_url, timeout=60) as c:
        yield c


def assert_openai_error(resp: httpx.Response, status: int, param: str | None = "ANY", code: str | None = "ANY") -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert "Traceback" not in err["message"] and "/site-packages/" not in err["message"]
    if param != "ANY":
        assert err["param"] == param
    if code != "ANY":
        assert err["code"] == code
    return err


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": DEFAULT_MODEL, "messages": []}, "messages"),
        ({"model": DEFAULT_MODEL}, "messages"),
        ({"messages": MSG}, "model"),
        ({"model": DEFAULT_MODEL, "messages": MSG, "n": 0}, "n"),
        ({"model": DEFAULT_MODEL, "messages": MSG, "n": 129}, "n"),
        ({"model": DEFAULT_MODEL, "messages": MSG, "max_tokens": -1}, "max_tokens"),
        ({"model": DEFAULT_MODEL, "messages": MSG, "max_tokens": 0}, "max_tokens"),
        ({"model": DEFAULT_MODEL, "messages": MSG, "max_tokens": "1e9"}, "max_tokens"),
        ({"model": DEFAULT_MODEL, "messages": MSG, "temperature": -1}, "temperature"),
        ({"model": DEFAULT_MODEL, "messages": MSG, "temperature": 1e9}, "temperature"),
        ({"model": DEFAULT_MODEL, "messages": MSG, "top_p": 2}, "top_p"),
        ({"model": DEFAULT_MODEL, "messages": MSG, "presence_penalty": 3}, "presence_penalty"),
        ({"model": DEFAULT_MODEL, "messages": MSG, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"model": DEFAULT_MODEL, "messages": MSG, "logit_bias": {"x": 1}}, "logit_bias"),
        ({"model": DEFAULT_MODEL, "messages": MSG, "logit_bias": {"5": 101}}, "logit_bias"),
        ({"model": DEFAULT_MODEL, "messages": MSG, "stop": ["x"] * 1000}, "stop"),
        ({"model": DEFAULT_MODEL, "messages": MSG, "stop": "x" * 100_000}, "stop"),
        ({"model": DEFAULT_MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ({"model": DEFAULT_MODEL, "messages": [{"role": "user"}]}, "messages.0.content"),
        ({"model": DEFAULT_MODEL, "messages": MSG, "stream_options": {"include_usage": True}}, None),
    ],
)
def test_invalid_chat_fields_are_400_with_param(http: httpx.Client, body: dict, param: str | None) -> None:
    err = assert_openai_error(http.post("/v1/chat/completions", json=body), 400)
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param


def test_nan_is_rejected(http: httpx.Client) -> None:
    raw = '{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}' % DEFAULT_MODEL
    assert_openai_error(
        http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"}), 400
    )


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"a string"', b"\x00\x01", b"\xff\xfe{}", b""])
def test_malformed_bodies_are_400(http: httpx.Client, raw: bytes) -> None:
    assert_openai_error(
        http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"}), 400
    )


def test_unknown_model_is_404(http: httpx.Client) -> None:
    err = assert_openai_error(http.post("/v1/chat/completions", json={"model": "nope", "messages": MSG}), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert_openai_error(http.get("/v1/models/nope"), 404, code="model_not_found")


def test_unknown_fields_are_ignored(http: httpx.Client) -> None:
    body = {"model": DEFAULT_MODEL, "messages": MSG, "max_tokens": 2, "store": True, "metadata": {"a": "b"}, "zzz": 1}
    assert http.post("/v1/chat/completions", json=body).status_code == 200


def test_context_length_exceeded(http: httpx.Client) -> None:
    body = {"model": DEFAULT_MODEL, "messages": MSG, "max_tokens": 10**9}
    assert_openai_error(http.post("/v1/chat/completions", json=body), 400, code="context_length_exceeded")
    body = {"model": DEFAULT_MODEL, "messages": MSG, "max_tokens": 2**63}
    assert_openai_error(http.post("/v1/chat/completions", json=body), 400, code="context_length_exceeded")
    long_prompt = {"model": DEFAULT_MODEL, "prompt": [1] * 9000, "max_tokens": 1}
    assert_openai_error(http.post("/v1/completions", json=long_prompt), 400, code="context_length_exceeded")


def test_completion_prompt_errors(http: httpx.Client) -> None:
    for prompt in ("", [], [-1], [10**9], [[]]):
        assert_openai_error(
            http.post("/v1/completions", json={"model": DEFAULT_MODEL, "prompt": prompt}), 400, param="prompt"
        )
    assert_openai_error(
        http.post("/v1/completions", json={"model": DEFAULT_MODEL, "prompt": "a", "suffix": "b"}), 400, param="suffix"
    )


def test_routes_and_methods(http: httpx.Client) -> None:
    assert_openai_error(http.get("/v1/nothing-here"), 404)
    assert_openai_error(http.delete("/v1/chat/completions"), 405)


def test_oversized_and_lying_bodies(http: httpx.Client) -> None:
    big = b"x" * (33 * 1024 * 1024)
    assert_openai_error(
        http.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"}), 413
    )
    # a negative Content-Length is refused by the HTTP parser itself (before the app): 400, connection closed
    host, port = http.base_url.host, http.base_url.port
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}")
        assert sock.recv(4096).split(b"\r\n", 1)[0].startswith(b"HTTP/1.1 400")


def test_server_still_serves(http: httpx.Client) -> None:
    resp = http.post("/v1/chat/completions", json={"model": DEFAULT_MODEL, "messages": MSG, "max_tokens": 2})
    assert resp.status_code == 200
    assert http.get("/health").json() == {"status": "ok"}
