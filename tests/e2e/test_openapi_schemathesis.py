"""Property-based fuzzing of the server's own OpenAPI (`/openapi.json`) with schemathesis, against a real server.

Every operation gets a few generated requests, valid ones (bodies built from the request schemas) and invalid ones
(schemathesis' negative mode), with a time bound for the whole run. Checks:

* `not_a_server_error`: no 5xx, whatever the input;
* `response_schema_conformance` and `content_type_conformance`: answers match what the OpenAPI declares. The
  declarations are thin: /v1 request bodies are the pydantic models, but 200 responses are untyped (`{}` or a bare
  object) and /v2 infer / generate / repository routes read the raw request, so their bodies are not described at
  all (schemathesis sends them without one). Error statuses are not declared either (FastAPI lists a 422 that the
  server never sends: it answers 400), so
* `errors_in_protocol_shape` (ours) checks every 4xx: JSON, OpenAI's `{"error": {...}}` on /v1 (and /v2/rerank),
  Anthropic's `{"type": "error", "error": {...}}` on /v1/messages and `{"error": "..."}` on /v2, no 422, nothing
  internal leaked.

Generation is kept cheap: `max_tokens` is clamped to 2, `n` / `best_of` to 1 and streams are turned off (streams are
tested elsewhere), so each valid generation costs a step or two of the small model.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from tests.conftest import ServerProcess

TOTAL_SECONDS = 120.0  # the whole run; operations not reached in time are reported as skipped
EXAMPLES = {GenerationMode.POSITIVE: 6, GenerationMode.NEGATIVE: 4}
LEAKS = ("Traceback", "site-packages", "/work/", "/tmp/", 'File "')
CLAMPS = {"max_tokens": 2, "max_completion_tokens": 2, "max_output_tokens": 2, "n": 1, "best_of": 1, "min_tokens": 1}


def errors_in_protocol_shape(ctx: Any, response: Any, case: Any) -> None:
    """Every client error is JSON in the protocol's own shape; FastAPI's 422 never escapes."""
    status = response.status_code
    assert status != 422, f"{case.operation.label}: a bare FastAPI 422"
    if not 400 <= status < 500:
        return
    content_type = (response.headers.get("content-type") or [""])[0]
    assert content_type.startswith("application/json"), f"{case.operation.label}: {status} as {content_type}"
    body = response.json()
    path = case.operation.path
    if path.startswith("/v1/messages"):  # Anthropic's shape
        assert isinstance(body, dict) and body.get("type") == "error", body
        assert set(body["error"]) == {"type", "message"} and body["error"]["message"], body
    elif (path.startswith("/v2") and path != "/v2/rerank") or path.startswith("/api/"):  # Triton's, Ollama's
        assert isinstance(body, dict) and set(body) == {"error"}, body
        assert isinstance(body["error"], str) and body["error"], body
    else:
        assert isinstance(body, dict) and set(body) == {"error"}, body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
    for marker in LEAKS:
        assert marker not in response.text, f"{marker!r} leaked: {response.text[:300]}"


def _clamp(case: Any) -> None:
    """Keep valid generations cheap; leave invalid values (negative mode) as generated."""
    body = case.body
    if not isinstance(body, dict):
        return
    for field, limit in CLAMPS.items():
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            body[field] = limit
    if body.get("stream") is True:
        body["stream"] = False
    body.pop("stream_options", None)


@pytest.fixture(scope="module")
def api_schema(server: ServerProcess) -> Any:
    return schemathesis.openapi.from_url(server.base_url + "/openapi.json")


def test_openapi_fuzzing_finds_no_server_errors(server: ServerProcess, api_schema: Any) -> None:
    checks = [not_a_server_error, response_schema_conformance, content_type_conformance, errors_in_protocol_shape]
    deadline = time.monotonic() + TOTAL_SECONDS
    failures: list[str] = []
    ran: list[str] = []
    skipped: list[str] = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        for mode, examples in EXAMPLES.items():
            label = f"{operation.label} [{mode.value}]"
            if time.monotonic() > deadline:
                skipped.append(label)
                continue

            @settings(
                max_examples=examples,
                deadline=None,
                derandomize=True,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def exercise(case: Any) -> None:
                _clamp(case)
                response = case.call(base_url=server.base_url, timeout=120)
                case.validate_response(response, checks=checks)

            try:
                exercise()
                ran.append(label)
            except Unsatisfiable:  # negative mode: nothing in this operation can be made invalid (plain strings)
                skipped.append(label)
            except Exception as exc:  # noqa: BLE001 - collected and reported together below
                failures.append(f"{label}: {type(exc).__name__}: {str(exc)[:800]}")
    print(f"schemathesis: {len(ran)} operation/mode pairs ran; skipped (time, or nothing to negate): {skipped}")
    assert len(ran) >= 20, (ran, skipped)
    assert not failures, "\n\n".join(failures)
    assert server.proc.poll() is None
