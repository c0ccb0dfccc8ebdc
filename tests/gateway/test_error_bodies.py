"""Errors render in the shape of the protocol that owns the path."""

from __future__ import annotations

from gateway.errors import (
    AuthenticationError,
    InvalidRequestError,
    OverloadedError,
    PayloadTooLargeError,
    ServiceUnavailableError,
    error_body,
)


def test_each_path_gets_its_protocols_shape() -> None:
    error = InvalidRequestError("bad field", param="x")
    assert error_body("/v1/chat/completions", error) == {
        "error": {"message": "bad field", "type": "invalid_request_error", "param": "x", "code": None}
    }
    assert error_body("/v1/responses", error)["error"]["param"] == "x"
    assert error_body("/v2/models/m/infer", error) == {"error": "bad field"}
    assert error_body("/v2/rerank", error)["error"]["type"] == "invalid_request_error"  # Cohere's alias: OpenAI's
    assert error_body("/v1/messages", error) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "bad field"},
    }
    assert error_body("/v1/messages/count_tokens", error)["type"] == "error"
    assert error_body("/api/chat", error) == {"error": "bad field"}  # Ollama's
    assert error_body("/api/tags", AuthenticationError("no key")) == {"error": "no key"}


def test_anthropic_types_follow_the_status() -> None:
    def kind(error: Exception) -> str:
        return error_body("/v1/messages", error)["error"]["type"]  # type: ignore[arg-type]

    assert kind(AuthenticationError("no key")) == "authentication_error"
    assert kind(PayloadTooLargeError("big")) == "request_too_large"
    assert kind(ServiceUnavailableError("busy")) == "overloaded_error"


def test_overload_is_429_with_retry_after_and_anthropics_529_overloaded_error() -> None:
    error = OverloadedError("the model is overloaded", reason="queue_full", retry_after=3)
    assert error.headers == {"Retry-After": "3"}
    assert error.status_for("/v1/chat/completions") == error.status_for("/v2/models/m/generate") == 429
    assert error_body("/v1/chat/completions", error)["error"]["type"] == "rate_limit_error"
    assert error_body("/v2/models/m/generate", error) == {"error": "the model is overloaded"}
    assert error.status_for("/v1/messages") == 529
    assert error_body("/v1/messages", error) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "the model is overloaded"},
    }
    assert InvalidRequestError("x").status_for("/v1/messages") == 400
