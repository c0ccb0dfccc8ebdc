"""API keys, the admin key, CORS, per-key rate limits and request ids, against a real server over HTTP and gRPC."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import DEFAULT_MODEL, KSERVE_REPOSITORY, ROOT, ServerProcess, free_port

USER_KEY = "sk-user-0123456789abcdef"
OTHER_KEY = "sk-user-fedcba9876543210"
TENANT_A = "sk-tenant-a-0123456789"  # keys of their own: RPM counts per key
TENANT_B = "sk-tenant-b-0123456789"
INDEX_KEY = "sk-index-0123456789"
ADMIN_KEY = "sk-admin-0123456789abcdef"
ORIGIN = "https://app.example.com"
RPM = 4
TPM = 60


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("secured_repository")
    shutil.copytree(KSERVE_REPOSITORY / "text_echo", repo / "text_echo")
    shutil.copytree(ROOT / "model_repository" / DEFAULT_MODEL, repo / DEFAULT_MODEL)
    keys = tmp_path_factory.mktemp("keys")
    (keys / "api").write_text(f"# team keys\n{USER_KEY}\n{OTHER_KEY}\n{TENANT_A}\n{TENANT_B}\n{INDEX_KEY}\n")
    (keys / "admin").write_text(ADMIN_KEY + "\n")
    grpc_port = free_port()
    proc = ServerProcess(
        repo,
        "--grpc-port",
        str(grpc_port),
        "--api-key-file",
        str(keys / "api"),
        "--admin-key-file",
        str(keys / "admin"),
        "--cors-allow-origin",
        ORIGIN,
        "--rate-limit-rpm",
        str(RPM),
        "--rate-limit-tpm",
        str(TPM),
        "--log-format",
        "json",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
    )
    proc.grpc_port = grpc_port  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        proc.stop()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}  # lowercase: gRPC metadata refuses capitals


def raw_request(port: int, request_line: bytes, headers: bytes = b"") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request_line + b"\r\nHost: x\r\n" + headers + b"Content-Length: 0\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    return reply


def test_public_routes_need_no_key(secured: ServerProcess) -> None:
    for path in ("/health", "/v2/health/live", "/v2/health/ready", "/metrics"):
        assert httpx.get(secured.base_url + path).status_code == 200, path


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": USER_KEY},
        {"Authorization": f"Basic {USER_KEY}"},
        bearer(USER_KEY.upper()),
        bearer(USER_KEY[:-1] + "0"),
        bearer("x" * len(USER_KEY)),
        {"X-Api-Key": USER_KEY},
    ],
)
def test_inference_without_a_valid_key_is_401(secured: ServerProcess, headers: dict[str, str]) -> None:
    for method, path in (
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v2/models/text_echo/infer"),
        ("GET", "/v2"),
        ("GET", "/v1/nonexistent"),
    ):
        resp = httpx.request(method, secured.base_url + path, headers=headers, json={})
        assert resp.status_code == 401, (path, headers, resp.text)
        assert resp.headers["www-authenticate"] == "Bearer"
        body = resp.json()
        error = body["error"]["message"] if path.startswith("/v1") else body["error"]
        assert USER_KEY not in error and "sk-" not in error


def test_openai_sdk_with_a_key(secured: ServerProcess) -> None:
    client = openai.OpenAI(base_url=secured.base_url + "/v1", api_key=OTHER_KEY, max_retries=0)
    assert DEFAULT_MODEL in [m.id for m in client.models.list().data]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=secured.base_url + "/v1", api_key="sk-wrong", max_retries=0).models.list()


def test_admin_routes_need_the_admin_key(secured: ServerProcess) -> None:
    url = secured.base_url + "/v2/repository/models/text_echo/load"
    assert httpx.post(url).status_code == 401
    denied = httpx.post(url, headers=bearer(USER_KEY))
    assert denied.status_code == 403 and "admin key" in denied.json()["error"]
    assert httpx.post(url, headers=bearer(ADMIN_KEY)).status_code == 200
    # the admin key also works on inference routes
    assert httpx.get(secured.base_url + "/v1/models", headers=bearer(ADMIN_KEY)).status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        b"//v2/repository/models/text_echo/unload",
        b"/v2/./repository/models/text_echo/unload",
        b"/v1/models/../../v2/repository/models/text_echo/unload",
        b"/v2/repository%2fmodels/text_echo/unload",
        b"/health/../v2/repository/models/text_echo/unload",
        b"/v2/%2e%2e/v2/repository/models/text_echo/unload",
    ],
)
def test_path_tricks_do_not_bypass_the_admin_key(secured: ServerProcess, path: bytes) -> None:
    reply = raw_request(
        secured.port, b"POST " + path + b" HTTP/1.1", b"Authorization: Bearer " + USER_KEY.encode() + b"\r\n"
    )
    status = int(reply.split(b" ", 2)[1])
    assert status in (400, 403), (path, reply[:300])
    assert b"READY" not in reply


def test_spoofed_host_does_not_matter(secured: ServerProcess) -> None:
    reply = raw_request(secured.port, b"GET /v1/models HTTP/1.1", b"X-Forwarded-Host: localhost\r\n")
    assert reply.startswith(b"HTTP/1.1 401")


def test_grpc_keys(secured: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{secured.grpc_port}")  # type: ignore[attr-defined]
    try:
        assert client.is_server_live() and client.is_server_ready()  # public
        text = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"hi"]], dtype=object))
        with pytest.raises(InferenceServerException) as missing:
            client.infer("text_echo", [text])
        assert missing.value.status() == "StatusCode.UNAUTHENTICATED"
        result = client.infer("text_echo", [text], headers=bearer(OTHER_KEY))
        assert result.as_numpy("UPPER").ravel().tolist() == [b"HI!"]
        with pytest.raises(InferenceServerException) as denied:
            client.unload_model("text_echo", headers=bearer(USER_KEY))
        assert denied.value.status() == "StatusCode.PERMISSION_DENIED"
        client.load_model("text_echo", headers=bearer(ADMIN_KEY))
    finally:
        client.close()


def test_cors(secured: ServerProcess) -> None:
    preflight = httpx.options(
        secured.base_url + "/v1/chat/completions",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    assert preflight.status_code == 200  # answered without a key, as browsers send none on preflights
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.options(
        secured.base_url + "/v1/chat/completions",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in other.headers
    resp = httpx.get(secured.base_url + "/v1/models", headers={"Origin": ORIGIN, **bearer(ADMIN_KEY)})
    assert resp.headers["access-control-allow-origin"] == ORIGIN


def test_request_id_is_echoed_and_logged(secured: ServerProcess) -> None:
    resp = httpx.get(secured.base_url + "/v1/models", headers={"X-Request-ID": "trace-42", **bearer(ADMIN_KEY)})
    assert resp.headers["x-request-id"] == "trace-42"
    fresh = httpx.get(secured.base_url + "/v1/models", headers={"X-Request-ID": "bad id\twith spaces"})
    assert fresh.headers["x-request-id"] != "bad id\twith spaces" and len(fresh.headers["x-request-id"]) == 32
    lines = [json.loads(line) for line in secured.log().splitlines() if line.startswith("{")]
    access = [e for e in lines if e.get("request_id") == "trace-42"]
    assert access and access[-1]["path"] == "/v1/models" and access[-1]["status"] == 200
    log_text = secured.log()
    for key in (USER_KEY, OTHER_KEY, ADMIN_KEY):
        assert key not in log_text


def test_requests_per_minute(secured: ServerProcess) -> None:
    """A fresh key: RPM requests pass, the next one gets 429 with Retry-After; other keys are unaffected."""
    url = secured.base_url + "/v2/models/text_echo"
    statuses = [httpx.get(url, headers=bearer(USER_KEY)).status_code for _ in range(RPM + 2)]
    assert statuses[: RPM - 1].count(200) >= RPM - 2 and statuses[-1] == 429, statuses
    limited = httpx.get(url, headers=bearer(USER_KEY))
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert "rate limit" in limited.json()["error"]
    assert httpx.get(secured.base_url + "/health").status_code == 200  # public routes are not limited


def test_tokens_per_minute(secured: ServerProcess) -> None:
    client = openai.OpenAI(base_url=secured.base_url + "/v1", api_key=OTHER_KEY, max_retries=0)
    first = client.completions.create(
        model=DEFAULT_MODEL,
        prompt="Count: one two three four five six",
        max_tokens=80,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert first.usage.total_tokens > TPM  # the request was admitted and ran to the end
    with pytest.raises(openai.RateLimitError) as err:
        client.completions.create(model=DEFAULT_MODEL, prompt="again", max_tokens=5)
    assert int(err.value.response.headers["retry-after"]) >= 1
    assert httpx.get(secured.base_url + "/health").status_code == 200


def test_repository_index_answers_whoever_may_infer(secured: ServerProcess) -> None:
    """Triton scripts list the models before inferring: tritonclient's index call works with an inference key over
    both protocols (not without a key); load and unload stay admin-only."""
    http = httpclient.InferenceServerClient(f"127.0.0.1:{secured.port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{secured.grpc_port}")  # type: ignore[attr-defined]
    try:
        assert "text_echo" in {m["name"] for m in http.get_model_repository_index(headers=bearer(INDEX_KEY))}
        rows = grpc.get_model_repository_index(headers=bearer(INDEX_KEY), as_json=True)["models"]
        assert "text_echo" in {m["name"] for m in rows}
        with pytest.raises(InferenceServerException) as missing:
            grpc.get_model_repository_index()
        assert missing.value.status() == "StatusCode.UNAUTHENTICATED"
        with pytest.raises(InferenceServerException) as denied:
            grpc.unload_model("text_echo", headers=bearer(INDEX_KEY))
        assert denied.value.status() == "StatusCode.PERMISSION_DENIED"
        with pytest.raises(InferenceServerException):
            http.unload_model("text_echo", headers=bearer(INDEX_KEY))
        assert httpx.post(secured.base_url + "/v2/repository/index").status_code == 401
    finally:
        http.close()
        grpc.close()


def test_sessions_belong_to_the_key_that_made_them(secured: ServerProcess) -> None:
    """The same session id with another key is another session; another key's DELETE of it is a 404."""
    a, b = bearer(TENANT_A), bearer(TENANT_B)
    issued = httpx.post(secured.base_url + "/v1/sessions", headers=a).json()["id"]
    assert issued.startswith("sess-") and len(issued) == len("sess-") + 32  # 128 random bits
    body = {"model": DEFAULT_MODEL, "prompt": "Hi", "max_tokens": 1, "temperature": 0}
    url = secured.base_url + "/v1/completions"
    assert httpx.post(url, json=body, headers={**a, "X-Session-ID": issued}, timeout=60).status_code == 200
    assert httpx.delete(f"{secured.base_url}/v1/sessions/{issued}", headers=b).status_code == 404
    assert httpx.post(url, json=body, headers={**b, "X-Session-ID": issued}, timeout=60).status_code == 200
    assert secured.metric("switchyard_kv_sessions") == 2  # two sessions: one per key
    assert httpx.delete(f"{secured.base_url}/v1/sessions/{issued}", headers=a).status_code == 200
    assert secured.metric("switchyard_kv_sessions") == 1  # b's is untouched
    assert httpx.delete(f"{secured.base_url}/v1/sessions/{issued}", headers=b).status_code == 200
