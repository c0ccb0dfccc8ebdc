"""One error tree for the whole gateway.

Every error carries its HTTP status and renders itself in the protocol's own shape: OpenAI's
`{"error": {"message", "type", "param", "code"}}` on /v1, KServe's `{"error": "..."}` on /v2 and Ollama's (the same
shape) on /api. Messages are written for the user: they never contain stack traces, file system paths or secrets.
"""

from __future__ import annotations

from typing import Any


class SwitchyardError(Exception):
    status: int = 500
    type: str = "internal_error"
    code: str | None = None
    anthropic_status: int | None = None  # where Anthropic answers this error with another status than `status`

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def openai_body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def kserve_body(self) -> dict[str, Any]:
        return {"error": self.message}

    def anthropic_body(self) -> dict[str, Any]:
        """Anthropic's shape: `{"type": "error", "error": {"type", "message"}}` with Anthropic's type names."""
        status = self.anthropic_status or self.status
        kind = ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def ollama_body(self) -> dict[str, Any]:
        """Ollama's shape: `{"error": "..."}` (its clients raise the message with the status)."""
        return {"error": self.message}

    def status_for(self, path: str) -> int:
        """The HTTP status on `path`: `status`, or `anthropic_status` on Anthropic's routes."""
        if self.anthropic_status is not None and path.startswith(ANTHROPIC_PATHS):
            return self.anthropic_status
        return self.status


# Anthropic's error types by HTTP status (its docs' table); others map to invalid_request_error / api_error.
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
ANTHROPIC_PATHS = ("/v1/messages",)  # Anthropic's routes answer errors in Anthropic's shape
OLLAMA_PATHS = ("/api/",)  # Ollama's routes answer errors in Ollama's shape
OPENAI_V2_PATHS = ("/v2/rerank",)  # /v2 routes that are not KServe's (Cohere's rerank alias)


def error_body(path: str, error: SwitchyardError) -> dict[str, Any]:
    """The error in the shape of the protocol that owns `path`."""
    if path.startswith(ANTHROPIC_PATHS):
        return error.anthropic_body()
    if path.startswith(OLLAMA_PATHS):
        return error.ollama_body()
    if path.startswith("/v2") and not path.startswith(OPENAI_V2_PATHS):
        return error.kserve_body()
    return error.openai_body()


class InvalidRequestError(SwitchyardError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceededError(InvalidRequestError):
    code = "context_length_exceeded"


class AuthenticationError(SwitchyardError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDeniedError(SwitchyardError):
    status = 403
    type = "permission_denied"
    code = "permission_denied"


class NotFoundError(SwitchyardError):
    status = 404
    type = "not_found_error"


class ModelNotFoundError(NotFoundError):
    type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model '{model}' does not exist or is not loaded.", param="model")


class MethodNotAllowedError(SwitchyardError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class PayloadTooLargeError(SwitchyardError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class UnsupportedMediaTypeError(SwitchyardError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class RateLimitError(SwitchyardError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class QuotaExceededError(RateLimitError):
    """A key's budget for its period is spent (OpenAI's `insufficient_quota`, also a 429)."""

    type = "insufficient_quota"
    code = "insufficient_quota"


class OverloadedError(RateLimitError):
    """The model's queue cannot take the request within its timeout (queue full, expected wait too long, timed
    out while waiting): refused before anything ran, with `Retry-After`. Anthropic answers overload with 529
    `overloaded_error`; `reason` labels the rejection in metrics."""

    code = "model_overloaded"
    anthropic_status = 529

    def __init__(self, message: str, *, reason: str, retry_after: int) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})
        self.reason = reason


class ServiceUnavailableError(SwitchyardError):
    status = 503
    type = "service_unavailable"
    code = "service_unavailable"


class InsufficientStorageError(SwitchyardError):
    """A write the request needs failed for lack of disk space (the Responses store's disk is full); the server
    goes on serving everything that needs no such write."""

    status = 507
    type = "server_error"
    code = "insufficient_storage"


class InternalError(SwitchyardError):
    status = 500
    type = "internal_error"
    code = "internal_error"


class ConfigError(Exception):
    """A configuration problem found at startup. The message names the file, the field and the fix."""


class BadGatewayError(SwitchyardError):
    """An upstream the gateway forwards to (backend: openai) failed or answered what no client should see."""

    status = 502
    type = "upstream_error"
    code = "bad_gateway"


class UpstreamConnectionError(BadGatewayError):
    """The upstream could not be reached, or dropped the connection before its answer was complete."""

    code = "upstream_unreachable"


class GatewayTimeoutError(SwitchyardError):
    """The upstream did not answer within its configured timeout."""

    status = 504
    type = "timeout"
    code = "upstream_timeout"
