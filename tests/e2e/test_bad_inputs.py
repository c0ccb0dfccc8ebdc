"""Issue #4: every class of bad input (the table below) sent to a real running server.

Each test asserts the clean status, the error in the protocol's own shape (`{"error": {"message", "type", "param",
"code"}}` on /v1, `{"error": "..."}` on /v2), that nothing internal leaks (paths, tracebacks, secrets) and that the
server still answers afterwards. Classes already tested elsewhere are not repeated; this table says where each is.

| class | what | tests |
| --- | --- | --- |
| 1 | non-JSON, array, string, NUL, invalid UTF-8 | test_errors.py::test_malformed_bodies_are_400; here: test_v1_bad_encodings_are_400, test_v2_bad_encodings_are_400 (NUL / invalid UTF-8 inside strings, lone UTF-16 surrogates, every /v1 POST route, /v2 JSON routes) |
| 2 | pickle / form content types | here: test_deserializing_content_types_are_refused (a pickle that would create a file is never unpickled) |
| 3 | oversized / lying bodies, chunks, headers | test_errors.py::test_oversized_and_lying_bodies (33 MiB -> 413, negative Content-Length); here: test_chunked_body_over_the_limit_is_413, test_a_million_tiny_chunks, test_content_length_shorter_than_the_body, test_content_length_longer_than_the_body_blocks_nobody, test_huge_heads_are_431 |
| 4 | thousands of validation errors | here: test_thousands_of_validation_errors_give_a_short_error |
| 5 | n, max_tokens, context | test_errors.py::test_invalid_chat_fields_are_400_with_param (n 0/129, max_tokens -1/0/"1e9"), ::test_context_length_exceeded (1e9, 2**63), test_openai_fields.py::test_chat_ranges (n 10**6); here: test_completion_counts_are_400 |
| 6 | logprobs, temperature, top_p, penalties, NaN/Infinity | test_errors.py::test_invalid_chat_fields_are_400_with_param, ::test_nan_is_rejected, test_openai_fields.py::test_chat_ranges / ::test_completion_ranges; here: test_non_finite_numbers_are_400, test_sampling_ranges_are_400 |
| 7 | token ids, empty prompt / messages / content | test_errors.py::test_completion_prompt_errors, ::test_invalid_chat_fields_are_400_with_param, test_openai_tokenize.py::test_tokenize_errors, test_embeddings.py::test_bad_requests; here: test_token_ids_outside_the_vocabulary_are_400 |
| 8 | logit_bias keys and values | test_errors.py (key "x", value 101), test_openai_fields.py (out-of-vocabulary key); here: test_bad_logit_bias_is_400 (5000-digit key, Unicode digits, NaN, 1025 entries) |
| 9 | thousands of stops, megabyte stops | test_errors.py (1000 stops, 100 KB stop); here: test_bad_stops_are_400 (10k stops, 1 MiB stop, chat and completions) |
| 10 | chat_template / chat_template_kwargs | here: test_request_chat_template_is_never_run, test_chat_template_kwargs_cannot_steer_the_renderer, test_message_text_is_not_a_template, test_rendering_is_off_the_event_loop |
| 11 | deep / recursive / invalid schemas, regexes | test_openai_structured.py::test_deep_schemas_are_400 (70 and 10k levels), ::test_bad_response_formats_are_400 (recursive, invalid), ::test_bad_structured_outputs_are_400; here: test_pathological_patterns_are_bounded, test_wide_schema_answers_validate, test_wider_schemas_are_400 |
| 12 | tools with invalid schema | test_openai_tools.py::test_bad_tools_are_400, ::test_deep_tool_schema_is_400; here: test_more_bad_tool_schemas_are_400 |
| 13 | multimodal URLs | here: test_image_urls_are_refused_and_never_fetched (images are not supported: 400, no fetch) |
| 14 | traversal names, symlinks | test_kserve_http.py::test_repository_names_cannot_escape, ::test_raw_traversal_paths_are_refused, ::test_symlink_escape_is_refused |
| 15 | config naming files outside the model | test_kserve_http.py::test_bad_load_requests; here: test_load_config_cannot_name_outside_files |
| 16 | admin endpoints without the admin key; no file path settings | test_access_control.py::test_admin_routes_need_the_admin_key, ::test_grpc_keys; here: test_repository_api_needs_the_admin_key, test_no_setting_takes_a_file_path |
| 17 | API keys, path tricks, spoofed Host, keys never logged | test_access_control.py::test_inference_without_a_valid_key_is_401, ::test_path_tricks_do_not_bypass_the_admin_key, ::test_spoofed_host_does_not_matter, ::test_request_id_is_echoed_and_logged |
| 18 | tensor shape / datatype / BYTES prefix / binary sizes | test_kserve_http.py::test_bad_tensors_are_400, ::test_bad_binary_bodies_are_400, test_kserve_grpc.py::test_errors_map_to_status_codes; here: test_more_bad_tensors_are_400, test_more_bad_binary_bodies_are_400 |
| 19 | batch > max_batch_size, missing / unknown inputs | test_kserve_http.py::test_bad_tensors_are_400 |
| 20 | 200 streams cut after 0.5 s; client gone | test_cancellation.py (20 streams, non-streaming); here: test_200_streams_cut_after_half_a_second_are_aborted |
| 21 | slow readers | here: test_a_client_that_never_reads_is_bounded_and_aborted |
| 22 | burst beyond capacity -> 429 | test_openai_model_config.py::test_full_queue_is_an_http_429_even_for_streams, test_kserve_http.py::test_full_queue_is_refused_with_429; here: test_burst_far_beyond_capacity_sheds_with_429 |
| 23 | backend failing on every call / the 11th call | test_kserve_http.py::test_model_errors_are_contained; here: test_backend_failing_on_every_call, test_backend_failing_on_the_eleventh_call |
| 24 | unload / reload while requests are in flight | here: test_reload_while_requests_are_in_flight, test_unload_while_requests_are_in_flight |
| 25 | SIGTERM during traffic | test_sigterm_drain.py::test_sigterm_drains_in_flight_requests_and_exits_zero |

The tensor classes run on a small server of their own (python models only, ten seconds to start) whose stream
send timeout is 2 s, so that a client that never reads is given up on quickly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import pickle
import shutil
import socket
import struct
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import psutil
import pytest

from tests.conftest import DEFAULT_MODEL, KSERVE_REPOSITORY, ServerProcess

MSG = [{"role": "user", "content": "hi"}]
CHAT = {"model": DEFAULT_MODEL, "messages": MSG, "max_tokens": 2}
JSON_HEADERS = {"content-type": "application/json"}
LEAKS = ("Traceback", "site-packages", "/work/", "/tmp/", "/opt/", "/root/", "secret", 'File "')
ADMIN_KEY = "bad-inputs-admin-key-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


# ---------------------------------------------------------------------------------------------------- helpers


def assert_no_leak(text: str) -> None:
    for marker in LEAKS:
        assert marker not in text, f"{marker!r} leaked: {text[:300]}"


def assert_openai_error(resp: httpx.Response, status: int | tuple[int, ...], param: str | None = "ANY") -> dict:
    statuses = (status,) if isinstance(status, int) else status
    assert resp.status_code in statuses, (resp.status_code, resp.text[:500])
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"] and len(err["message"]) <= 1000
    assert err["type"] == ("invalid_request_error" if resp.status_code < 500 else err["type"])
    if param != "ANY":
        assert err["param"] == param, err
    assert_no_leak(resp.text)
    return err


def assert_v2_error(resp: httpx.Response, status: int | tuple[int, ...]) -> str:
    statuses = (status,) if isinstance(status, int) else status
    assert resp.status_code in statuses, (resp.status_code, resp.text[:500])
    body = resp.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
    assert len(body["error"]) <= 1000
    assert_no_leak(resp.text)
    return body["error"]


def raw_exchange(port: int, data: bytes, *, chunks: Iterator[bytes] | None = None, timeout: float = 60) -> bytes:
    """Send raw bytes over one connection and read the reply until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
            for chunk in chunks or ():
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before the client is done sending
        reply = b""
        try:
            while part := sock.recv(65536):
                reply += part
        except (ConnectionResetError, TimeoutError):
            pass
    return reply


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def json_of(reply: bytes) -> Any:
    return json.loads(reply.split(b"\r\n\r\n", 1)[1])


@pytest.fixture(scope="module")
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=120) as c:
        yield c


@pytest.fixture(autouse=True)
def _alive_after(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test, each server it used still answers its health check."""
    yield
    for name in ("server", "tensors"):
        if name in request.fixturenames:
            proc: ServerProcess = request.getfixturevalue(name)
            assert proc.proc.poll() is None, proc.log()
            assert httpx.get(proc.base_url + "/v2/health/live", timeout=30).status_code == 200


# ------------------------------------------------------------------------- the tensor server of this module

ALWAYS_FAILS = (
    """backend: python
max_batch_size: 0
input: [{name: IN, data_type: TYPE_INT32, dims: [1]}]
output: [{name: OUT, data_type: TYPE_INT32, dims: [1]}]
""",
    """import numpy as np


class TritonPythonModel:
    def execute(self, requests):
        raise RuntimeError("backend down: secret-token-123 at /opt/internal/model.bin")
""",
)

ELEVENTH_FAILS = (
    ALWAYS_FAILS[0],
    """import numpy as np


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        if self.calls == 11:
            raise RuntimeError("the eleventh call fails: secret-token-456 /opt/internal")
        return [{"OUT": r["IN"] * 2} for r in requests]
""",
)

SLOW_TAG = (
    """backend: python
max_batch_size: 0
input: [{name: DELAY_MS, data_type: TYPE_INT32, dims: [1]}]
output: [{name: TAG, data_type: TYPE_INT32, dims: [1]}]
parameters: {tag: "1"}
""",
    """import time

import numpy as np


class TritonPythonModel:
    def initialize(self, args):
        self.tag = int(args["parameters"]["tag"])

    def execute(self, requests):
        time.sleep(max(int(r["DELAY_MS"][0]) for r in requests) / 1000)
        return [{"TAG": np.array([self.tag], dtype=np.int32)} for r in requests]
""",
)


def slow_tag_config(tag: str, **extra: Any) -> dict[str, Any]:
    return {
        "backend": "python",
        "max_batch_size": 0,
        "parameters": {"tag": tag},
        "input": [{"name": "DELAY_MS", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "TAG", "data_type": "TYPE_INT32", "dims": [1]}],
        **extra,
    }


@pytest.fixture(scope="module")
def tensors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("bad_inputs_repository")
    for name in ("add_sub", "text_echo", "counter_stream", "queue_probe"):
        shutil.copytree(KSERVE_REPOSITORY / name, repo / name)
    for name, (config, model) in {
        "always_fails": ALWAYS_FAILS,
        "eleventh_fails": ELEVENTH_FAILS,
        "slow_tag": SLOW_TAG,
    }.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.yaml").write_text(config)
        (repo / name / "1" / "model.py").write_text(model)
    key = tmp_path_factory.mktemp("bad_inputs_keys") / "admin"
    key.write_text(ADMIN_KEY + "\n")
    proc = ServerProcess(
        repo,
        "--admin-key-file",
        str(key),
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
        "--stream-send-timeout-secs",
        "2",
        startup_timeout=300,
    )
    proc.repo = repo  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def v2(tensors: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=tensors.base_url, timeout=120) as c:
        yield c


def tensor(name: str, datatype: str, shape: list, data: Any = None, **extra: Any) -> dict[str, Any]:
    out = {"name": name, "datatype": datatype, "shape": shape, **extra}
    if data is not None:
        out["data"] = data
    return out


A4 = tensor("INPUT0", "FP32", [1, 4], [1, 2, 3, 4])
B4 = tensor("INPUT1", "FP32", [1, 4], [1, 1, 1, 1])


# ------------------------------------------------------------------------------------------ 1. body encodings

V1_POSTS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize", "/detokenize"]
BAD_ENCODINGS = {
    "raw NUL in a string": b'{"model": "m", "prompt": "a\x00b", "messages": [], "input": "a\x00b"}',
    "invalid UTF-8 in a string": b'{"model": "m", "prompt": "a\xff\xfeb", "input": "a\xc3\x28"}',
    "escaped lone surrogate": b'{"model": "MODEL", "prompt": "a\\ud800", "input": "a\\ud800", "tokens": [1], '
    b'"messages": [{"role": "user", "content": "\\udc00"}]}',
    "UTF-8-encoded surrogate": b'{"model": "MODEL", "prompt": "a\xed\xa0\x80", "input": "a\xed\xa0\x80", '
    b'"tokens": [1], '
    b'"messages": [{"role": "user", "content": "\xed\xb0\x80"}]}',
    "surrogate in a key": b'{"model": "MODEL", "prompt": "a", "input": "a", "tokens": [1], "\\ud800": 1, '
    b'"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"\\ud800": 1}}',
}


@pytest.mark.parametrize("path", V1_POSTS)
@pytest.mark.parametrize("case", list(BAD_ENCODINGS))
def test_v1_bad_encodings_are_400(http: httpx.Client, path: str, case: str) -> None:
    raw = BAD_ENCODINGS[case].replace(b"MODEL", b"all-minilm-l6-v2" if "embeddings" in path else DEFAULT_MODEL.encode())
    assert_openai_error(http.post(path, content=raw, headers=JSON_HEADERS), 400)


def test_escaped_nul_and_valid_surrogate_pairs_are_text(http: httpx.Client) -> None:
    """A NUL escaped inside a string, and an escaped surrogate pair (an emoji), are ordinary text."""
    raw = b'{"model": "%s", "prompt": "a\\u0000b \\ud83d\\ude00"}' % DEFAULT_MODEL.encode()
    resp = http.post("/tokenize", content=raw, headers=JSON_HEADERS)
    assert resp.status_code == 200, resp.text
    text = http.post("/detokenize", json={"model": DEFAULT_MODEL, "tokens": resp.json()["tokens"]}).json()["prompt"]
    assert text.endswith("a\x00b \N{GRINNING FACE}")


@pytest.mark.parametrize("case", list(BAD_ENCODINGS))
@pytest.mark.parametrize(
    "path", ["/v2/models/text_echo/infer", "/v2/models/text_echo/generate", "/v2/repository/models/text_echo/load"]
)
def test_v2_bad_encodings_are_400(v2: httpx.Client, path: str, case: str) -> None:
    raw = {
        "raw NUL in a string": b'{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], '
        b'"data": ["a\x00"]}]}',
        "invalid UTF-8 in a string": b'{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], '
        b'"data": ["\xff"]}]}',
        "escaped lone surrogate": b'{"TEXT": "\\ud800", "inputs": [{"name": "TEXT", "datatype": "BYTES", '
        b'"shape": [1, 1], "data": ["\\ud800"]}], "parameters": {"config": "\\ud800"}}',
        "UTF-8-encoded surrogate": b'{"TEXT": "\xed\xa0\x80", "inputs": [{"name": "TEXT", "datatype": "BYTES", '
        b'"shape": [1, 1], "data": ["\xed\xa0\x80"]}]}',
        "surrogate in a key": b'{"\\udfff": 1, "TEXT": "a", "inputs": [{"name": "\\udfff", "datatype": "BYTES", '
        b'"shape": [1, 1], "data": ["a"]}]}',
    }[case]
    assert_v2_error(v2.post(path, content=raw, headers={**JSON_HEADERS, **ADMIN}), 400)
    # the same lone surrogate in the JSON header of a binary request
    if case == "escaped lone surrogate" and path.endswith("/infer"):
        head = (
            b'{"inputs": [{"name": "TEXT\\ud800", "datatype": "BYTES", "shape": [1, 1], '
            b'"parameters": {"binary_data_size": 5}}]}'
        )
        resp = v2.post(
            path,
            content=head + struct.pack("<I", 1) + b"a",
            headers={"Inference-Header-Content-Length": str(len(head))},
        )
        assert_v2_error(resp, 400)


# -------------------------------------------------------------------------------------- 2. content types


class _Boom:
    """Unpickling this runs `open(marker, "w")`: if the file appears, something unpickled our body."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize(
    "content_type",
    [
        "application/python-pickle",
        "application/x-pickle",
        "application/octet-stream",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=xyz",
        "application/msgpack",
        "text/plain",
    ],
)
def test_deserializing_content_types_are_refused(
    http: httpx.Client, v2: httpx.Client, tmp_path: Path, content_type: str
) -> None:
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Boom(marker))
    if content_type.startswith("application/x-www-form"):
        payload = b"model=" + DEFAULT_MODEL.encode() + b"&messages=hi&prompt=hi"
    elif content_type.startswith("multipart"):
        payload = b'--xyz\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nhi\r\n--xyz--\r\n'
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        resp = http.post(path, content=payload, headers={"content-type": content_type})
        assert_openai_error(resp, 415)
        assert "application/json" in resp.json()["error"]["message"]
    for path in ("/v2/models/add_sub/infer", "/v2/models/text_echo/generate"):
        assert_v2_error(v2.post(path, content=payload, headers={"content-type": content_type}), (400, 415))
    binary = v2.post(
        "/v2/models/add_sub/infer",
        content=payload,
        headers={"content-type": content_type, "Inference-Header-Content-Length": "0"},
    )
    assert_v2_error(binary, 400)
    assert not marker.exists(), "a request body was unpickled"


# -------------------------------------------------------------------------------------- 3. sizes and framing


def test_chunked_body_over_the_limit_is_413(server: ServerProcess) -> None:
    """No Content-Length: the limit is enforced while the chunks stream in."""
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    block = b"x" * (1 << 20)
    chunks = (b"%x\r\n" % len(block) + block + b"\r\n" for _ in range(40))  # 40 MiB > the 32 MiB default
    reply = raw_exchange(server.port, head, chunks=chunks)
    assert status_of(reply) == 413, reply[:300]
    assert json_of(reply)["error"]["code"] == "payload_too_large"


def test_a_million_tiny_chunks(server: ServerProcess) -> None:
    """A valid body sent as a million one-byte chunks is read (bounded by the body limit) and answered."""
    body = b" " * 1_000_000 + json.dumps({**CHAT, "max_tokens": 1}).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    wire = b"".join(b"1\r\n" + body[i : i + 1] + b"\r\n" for i in range(len(body))) + b"0\r\n\r\n"
    started = time.monotonic()
    reply = raw_exchange(server.port, head + wire, timeout=120)
    assert status_of(reply) == 200, reply[:300]
    assert time.monotonic() - started < 60


def test_content_length_shorter_than_the_body(server: ServerProcess) -> None:
    """The declared length wins: the body is cut (not JSON) and the rest is read as a next request, which is not
    HTTP: 400 either way (from the parser, which then closes the connection, or from the app)."""
    body = json.dumps(CHAT).encode()
    reply = raw_exchange(
        server.port,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 10\r\n\r\n" + body,
    )
    assert status_of(reply) == 400, reply[:300]
    assert_no_leak(reply.decode("latin-1"))


def test_content_length_longer_than_the_body_blocks_nobody(server: ServerProcess, http: httpx.Client) -> None:
    """A client that promises more body than it sends holds only its own connection."""
    sockets = []
    try:
        for _ in range(20):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100000\r\n\r\n{"model":'
            )
            sockets.append(sock)
        assert http.get("/v1/models").status_code == 200
        assert http.post("/tokenize", json={"model": DEFAULT_MODEL, "prompt": "still here"}).status_code == 200
    finally:
        for sock in sockets:
            sock.close()


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(10_000)) + b"\r\n",
        b"GET /v1/models?" + b"q" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v2/models/add_sub HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n",
    ],
)
def test_huge_heads_are_431(server: ServerProcess, head: bytes) -> None:
    reply = raw_exchange(server.port, head)
    assert status_of(reply) in (400, 431), reply[:300]
    if status_of(reply) == 431:
        body = json_of(reply)
        if head.split(b" ")[1].startswith(b"/v2"):
            assert isinstance(body["error"], str)
        else:
            assert body["error"]["code"] == "request_header_fields_too_large"


def test_an_endless_header_is_cut_off(server: ServerProcess) -> None:
    """One header value that never ends: refused once the head passes the limit, memory stays flat."""
    proc = psutil.Process(server.proc.pid)
    before = proc.memory_info().rss
    block = b"a" * (1 << 20)
    reply = raw_exchange(
        server.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Endless: ", chunks=(block for _ in range(64))
    )
    if reply:  # the refusal may be lost to the reset of a connection closed with unread data
        assert status_of(reply) == 431, reply[:300]
    assert proc.memory_info().rss - before < 32 * (1 << 20)
    # an ordinary large-ish header (an 8 KiB cookie) is fine
    assert httpx.get(server.base_url + "/v1/models", headers={"Cookie": "c=" + "x" * 8192}).status_code == 200


# --------------------------------------------------------------------------------------- 4. error floods


def test_thousands_of_validation_errors_give_a_short_error(http: httpx.Client, v2: httpx.Client) -> None:
    many = {
        "model": DEFAULT_MODEL,
        "messages": [{"role": "wizard", "content": 5, "name": []}] * 5000,
        "tools": [{"type": "nope"}] * 128,
        "stop": [1] * 64,
        "n": "x",
        "temperature": "y",
    }
    err = assert_openai_error(http.post("/v1/chat/completions", json=many), 400)
    assert len(err["message"]) <= 500 and "more errors" in err["message"]
    completions = {"model": DEFAULT_MODEL, "prompt": [[-1, "x", None]] * 5000}
    assert len(assert_openai_error(http.post("/v1/completions", json=completions), 400)["message"]) <= 500
    tensors = {"inputs": [{"name": f"IN{i}", "datatype": "NOPE", "shape": "x"} for i in range(5000)]}
    assert len(assert_v2_error(v2.post("/v2/models/add_sub/infer", json=tensors), 400)) <= 500


# -------------------------------------------------------------------------------------- 5-9. sampling fields


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"n": 10**6}, "n"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "1e9"}, "max_tokens"),
        ({"max_tokens": 1e9}, "max_tokens"),
        ({"max_tokens": 2**63}, "max_tokens"),
        ({"max_tokens": 2**200}, "max_tokens"),
        ({"best_of": 10**6}, "best_of"),
        ({"logprobs": 6, "n": 128}, "logprobs"),
        ({"logprobs": 5, "n": 129}, "n"),
    ],
)
def test_completion_counts_are_400(http: httpx.Client, extra: dict, param: str) -> None:
    resp = http.post("/v1/completions", json={"model": DEFAULT_MODEL, "prompt": "hi", **extra})
    err = assert_openai_error(resp, 400, param)
    if extra.get("max_tokens") in (1e9, 2**63, 2**200):
        assert err["code"] == "context_length_exceeded"


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400"])
@pytest.mark.parametrize(
    "field", [b"temperature", b"top_p", b"presence_penalty", b"frequency_penalty", b"repetition_penalty", b"min_p"]
)
def test_non_finite_numbers_are_400(http: httpx.Client, field: bytes, literal: bytes) -> None:
    for path, body in (
        ("/v1/chat/completions", b'"messages": [{"role": "user", "content": "hi"}]'),
        ("/v1/completions", b'"prompt": "hi"'),
    ):
        raw = b'{"model": "%s", %s, "%s": %s}' % (DEFAULT_MODEL.encode(), body, field, literal)
        assert_openai_error(http.post(path, content=raw, headers=JSON_HEADERS), 400, field.decode())


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"top_logprobs": -1, "logprobs": True}, "top_logprobs"),
        ({"top_logprobs": 5}, "top_logprobs"),
        ({"top_logprobs": 20, "logprobs": True, "n": 129}, "n"),
        ({"temperature": -0.01}, "temperature"),
        ({"temperature": 2.01}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"presence_penalty": -2.5}, "presence_penalty"),
        ({"top_k": -5}, "top_k"),
        ({"seed": -(2**64)}, "seed"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"priority": 1.5}, "priority"),
    ],
)
def test_sampling_ranges_are_400(http: httpx.Client, extra: dict, param: str) -> None:
    assert_openai_error(http.post("/v1/chat/completions", json={**CHAT, **extra}), 400, param)


def test_token_ids_outside_the_vocabulary_are_400(http: httpx.Client) -> None:
    for prompt in ([-1], [49152], [2**31], [2**63], [10**30], [[1, 2], [3, -4]], [[10**30]]):
        assert_openai_error(
            http.post("/v1/completions", json={"model": DEFAULT_MODEL, "prompt": prompt}), 400, "prompt"
        )
    for tokens in ([-1], [49152], [10**30]):
        assert_openai_error(http.post("/detokenize", json={"model": DEFAULT_MODEL, "tokens": tokens}), 400)
    for ids in ([-1], [10**9], [10**30]):
        assert_openai_error(
            http.post("/v1/chat/completions", json={**CHAT, "stop_token_ids": ids}), 400, "stop_token_ids"
        )
    assert_openai_error(http.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": [[10**9]]}), 400)
    assert_openai_error(http.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": [[-3]]}), 400)
    assert_openai_error(http.post("/v1/chat/completions", json={**CHAT, "messages": []}), 400, "messages")
    assert_openai_error(
        http.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user"}]}), 400, "messages.0.content"
    )
    assert_openai_error(http.post("/v1/completions", json={"model": DEFAULT_MODEL, "prompt": ""}), 400, "prompt")


@pytest.mark.parametrize(
    "bias",
    [
        {"9" * 5000: 1},
        {"-" + "9" * 5000: 1},
        {"\N{ARABIC-INDIC DIGIT THREE}": 1},
        {"1.5": 1},
        {"0x10": 1},
        {" 5": 1},
        {"": 1},
        {"--5": 1},
        {"5": 100.5},
        {"5": -101},
        {"5": "x"},
        {"5": None},
        {"5": [1]},
        {str(i): 1 for i in range(1025)},
        {"-5": 1},
        {"49152": 1},
    ],
)
def test_bad_logit_bias_is_400(http: httpx.Client, bias: dict) -> None:
    err = assert_openai_error(http.post("/v1/chat/completions", json={**CHAT, "logit_bias": bias}), 400)
    assert err["param"].startswith("logit_bias")
    resp = http.post("/v1/completions", json={"model": DEFAULT_MODEL, "prompt": "hi", "logit_bias": bias})
    assert assert_openai_error(resp, 400)["param"].startswith("logit_bias")


def test_non_finite_logit_bias_is_400(http: httpx.Client) -> None:
    raw = b'{"model": "%s", "prompt": "hi", "logit_bias": {"5": NaN}}' % DEFAULT_MODEL.encode()
    assert assert_openai_error(http.post("/v1/completions", content=raw, headers=JSON_HEADERS), 400)[
        "param"
    ].startswith("logit_bias")


@pytest.mark.parametrize("stop", [["ab"] * 10_000, "x" * (1 << 20), ["x" * (1 << 20)], [""], [1], [None], {"a": 1}])
def test_bad_stops_are_400(http: httpx.Client, stop: Any) -> None:
    started = time.monotonic()
    assert_openai_error(http.post("/v1/chat/completions", json={**CHAT, "stop": stop}), 400, "stop")
    assert_openai_error(
        http.post("/v1/completions", json={"model": DEFAULT_MODEL, "prompt": "hi", "stop": stop}), 400, "stop"
    )
    assert time.monotonic() - started < 10


# -------------------------------------------------------------------------------- 10. templates, kwargs


def _prompt_tokens(http: httpx.Client, **extra: Any) -> int:
    resp = http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize(
    "template",
    [
        "{% for i in range(10**9) %}{{ i }}{% endfor %}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os.popen('touch /tmp/switchyard-pwned').read() }}",
        "{% set x = namespace(a=[]) %}{% for i in range(99999) %}{% set x.a = x.a + [i] %}{% endfor %}",
    ],
)
def test_request_chat_template_is_never_run(http: httpx.Client, template: str) -> None:
    """A request-supplied template is ignored (the model's own renders the prompt), so it cannot run or loop."""
    plain = _prompt_tokens(http)
    started = time.monotonic()
    assert _prompt_tokens(http, chat_template=template) == plain
    assert _prompt_tokens(http, chat_template_kwargs={"chat_template": template}) == plain
    assert time.monotonic() - started < 30
    assert not Path("/tmp/switchyard-pwned").exists()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"continue_final_message": True},
        {"tokenize": True},
        {"return_dict": True},
        {"conversation": [1]},
        {"tokenizer_kwargs": {"add_special_tokens": True}},
        {"return_assistant_tokens_mask": True},
        {"padding": "max_length", "max_length": 1, "truncation": True, "return_tensors": "np"},
        {"self": 1},
        {"add_generation_prompt": False},
        {"messages": []},
        {"tools": [1]},
        {"documents": 5},
        {"raise_exception": 1, "range": "x", "namespace": None, "strftime_now": 3},
        {"x" * 1000: "y" * 100_000},
    ],
)
def test_chat_template_kwargs_cannot_steer_the_renderer(http: httpx.Client, kwargs: dict) -> None:
    """kwargs that name the renderer's own parameters are dropped; others that break the template are a 400."""
    resp = http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1, "chat_template_kwargs": kwargs})
    if resp.status_code != 200:
        assert_openai_error(resp, 400, "chat_template_kwargs")
    tokenized = http.post("/tokenize", json={"model": DEFAULT_MODEL, "messages": MSG, "chat_template_kwargs": kwargs})
    if tokenized.status_code != 200:
        assert_openai_error(tokenized, 400, "chat_template_kwargs")


def test_message_text_is_not_a_template(http: httpx.Client) -> None:
    content = "{{ 7 * 7 }} {% for i in range(3) %}loop{% endfor %} {{ raise_exception('x') }}"
    tokens = http.post("/tokenize", json={"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": content}]})
    assert tokens.status_code == 200, tokens.text
    prompt = http.post("/detokenize", json={"model": DEFAULT_MODEL, "tokens": tokens.json()["tokens"]}).json()["prompt"]
    assert content in prompt and "49" not in prompt and "looploop" not in prompt


async def test_rendering_is_off_the_event_loop(server: ServerProcess) -> None:
    """While a huge conversation renders, the server keeps answering other requests."""
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(40_000)]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
        started_all = time.monotonic()
        big = asyncio.create_task(client.post("/tokenize", json={"model": DEFAULT_MODEL, "messages": messages}))
        await asyncio.sleep(0.5)  # upload and validation (on the loop) are done; rendering runs
        worst = 0.0
        while not big.done():
            started = time.monotonic()
            assert (await client.get("/v2/health/live")).status_code == 200
            worst = max(worst, time.monotonic() - started)
            await asyncio.sleep(0.05)
        resp = await big
        total = time.monotonic() - started_all
    assert resp.status_code == 200, resp.text[:300]
    # on the loop, rendering would stall it for most of the request; off it, only the GIL's switch interval shows
    assert worst < 2.0 and worst < total / 2, f"the event loop stalled {worst:.2f} s of a {total:.2f} s request"


# ---------------------------------------------------------------------------- 11-12. grammars and tools


@pytest.mark.parametrize(
    "extra",
    [
        {"structured_outputs": {"regex": "(a*)*(b+b+)+c"}},
        {"structured_outputs": {"regex": "((a{1,100}){1,100}){1,100}"}},
        {"structured_outputs": {"regex": "(x|xx|xxx|xxxx)*y" * 50}},
        {"structured_outputs": {"regex": "[\\s\\S]{0,65535}" * 4}},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "p",
                    "schema": {
                        "type": "object",
                        "properties": {"a": {"type": "string", "pattern": "^((a+)+)+$", "maxLength": 10**9}},
                    },
                },
            }
        },
        {"structured_outputs": {"grammar": 'start: a\na: "x" a | "x" | b\nb: a'}},
    ],
)
def test_pathological_patterns_are_bounded(http: httpx.Client, extra: dict) -> None:
    started = time.monotonic()
    resp = http.post("/v1/chat/completions", json={**CHAT, **extra})
    assert time.monotonic() - started < 60
    if resp.status_code != 200:
        err = assert_openai_error(resp, 400)
        assert err["param"] in ("structured_outputs", "response_format")


def test_wide_schema_answers_validate(http: httpx.Client) -> None:
    # 1000 properties once compiled and then failed on the object's first token (llguidance's parser row limit),
    # ending the answer as "{" with finish_reason "stop".
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1000)}}
    body = {
        **CHAT,
        "max_tokens": 20,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "wide", "schema": schema}},
    }
    resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    content = choice["message"]["content"]
    if choice["finish_reason"] == "stop":
        jsonschema.validate(json.loads(content), schema)
    else:
        assert choice["finish_reason"] == "length" and len(content) > 1, choice


def test_wider_schemas_are_400(http: httpx.Client) -> None:
    schema = {"type": "object", "properties": {f"p{i}": {} for i in range(2001)}}
    body = {
        **CHAT,
        "max_tokens": 5,
        "response_format": {"type": "json_schema", "json_schema": {"name": "wider", "schema": schema}},
    }
    assert_openai_error(http.post("/v1/chat/completions", json=body), 400, "response_format")


@pytest.mark.parametrize(
    "tools",
    [
        [
            {
                "type": "function",
                "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"minimum": "zero"}}}},
            }
        ],
        [{"type": "function", "function": {"name": "f", "parameters": [1]}}],
        [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "http://127.0.0.1:1/schema.json"}}}],
        [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": "a"}}}],
        [{"type": "function", "function": {"name": "f", "parameters": {"pattern": "(a"}}}],
        [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)],
    ],
)
def test_more_bad_tool_schemas_are_400(http: httpx.Client, tools: list) -> None:
    resp = http.post("/v1/chat/completions", json={**CHAT, "tools": tools, "tool_choice": "required"})
    assert assert_openai_error(resp, 400)["param"].startswith("tools")


# ------------------------------------------------------------------------------------- 13. multimodal URLs


def test_image_urls_are_refused_and_never_fetched(http: httpx.Client) -> None:
    hits: list[str] = []

    class Recorder(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    listener = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    port = listener.server_address[1]
    try:
        urls = [
            f"http://127.0.0.1:{port}/cat.png",
            f"http://[::1]:{port}/x.png",
            "http://169.254.169.254/latest/meta-data/",
            f"http://2130706433:{port}/x.png",
            f"http://0x7f000001:{port}/x.png",
            "file:///etc/passwd",
            "gopher://127.0.0.1:11211/_stats",
            "data:image/png;base64,iVBORw0KGgo=",
        ]
        for url in urls:
            for part in ({"type": "image_url", "image_url": {"url": url}}, {"type": "input_image", "image_url": url}):
                messages = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}]
                err = assert_openai_error(http.post("/v1/chat/completions", json={**CHAT, "messages": messages}), 400)
                assert err["param"] == "messages.0.content"
        audio = [
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}
        ]
        assert_openai_error(http.post("/v1/chat/completions", json={**CHAT, "messages": audio}), 400)
        time.sleep(0.5)
        assert hits == [], f"the server fetched {hits}"
    finally:
        listener.shutdown()
        listener.server_close()


# --------------------------------------------------------------------------------- 15-16. repository, admin


def test_load_config_cannot_name_outside_files(v2: httpx.Client) -> None:
    for extra in (
        {"default_model_filename": "../../../../etc/passwd"},
        {"default_model_filename": "/etc/passwd"},
        {"model": "/etc"},
        {"default_model_filename": "../../text_echo/1/model.py"},
    ):
        resp = v2.post(
            "/v2/repository/models/slow_tag/load",
            headers=ADMIN,
            json={"parameters": {"config": json.dumps(slow_tag_config("9", **extra))}},
        )
        assert_v2_error(resp, 400)
    for files in ({"file:../../evil.py": "cHJpbnQoMSk="}, {"file:/etc/cron.d/x": "eA=="}):
        assert_v2_error(v2.post("/v2/repository/models/slow_tag/load", headers=ADMIN, json={"parameters": files}), 400)
    # the model is untouched and still serves
    resp = v2.post("/v2/models/slow_tag/infer", json={"inputs": [tensor("DELAY_MS", "INT32", [1], [0])]})
    assert resp.status_code == 200 and resp.json()["outputs"][0]["data"] == [1]


def test_repository_api_needs_the_admin_key(tensors: ServerProcess) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer " + "x" * len(ADMIN_KEY)},
        {"Authorization": ADMIN_KEY},
        {"Authorization": f"Bearer {ADMIN_KEY.upper()}"},
    ):
        for path in ("/v2/repository/models/text_echo/unload", "/v2/repository/models/text_echo/load"):
            resp = httpx.post(tensors.base_url + path, headers=headers)
            assert resp.status_code in (401, 403), (path, headers, resp.text)
            assert ADMIN_KEY not in resp.text and ADMIN_KEY.upper() not in resp.text
    assert httpx.post(tensors.base_url + "/v2/models/text_echo/generate", json={"TEXT": "x"}).status_code == 200
    assert ADMIN_KEY not in tensors.log()


def test_no_setting_takes_a_file_path(http: httpx.Client, v2: httpx.Client, tmp_path: Path) -> None:
    """Triton's log and trace settings (which name files) are not served; nothing writes where a client says."""
    target = tmp_path / "written-by-a-client"
    for client in (http, v2):
        for path, body in (
            ("/v2/logging", {"log_file": str(target)}),
            ("/v2/trace/setting", {"trace_file": str(target)}),
            ("/v2/models/add_sub/trace/setting", {"trace_file": str(target)}),
        ):
            resp = client.post(path, json=body, headers=ADMIN)
            assert resp.status_code in (400, 403, 404, 405), (path, resp.status_code)
            assert_v2_error(resp, resp.status_code)
    assert not target.exists()


# ------------------------------------------------------------------------------------------ 18. v2 tensors


@pytest.mark.parametrize(
    "inputs",
    [
        [tensor("INPUT0", "FP32", [2**40, 2**40], [1, 2, 3, 4]), B4],
        [tensor("INPUT0", "FP32", [2**64, 4], [1, 2, 3, 4]), B4],
        [tensor("INPUT0", "FP32", [-1, 4], [1, 2, 3, 4]), B4],
        [tensor("INPUT0", "FP32", [1.0, 4], [1, 2, 3, 4]), B4],
        [tensor("INPUT0", "FP32", [True, 4], [1, 2, 3, 4]), B4],
        [tensor("INPUT0", "FP32", "1,4", [1, 2, 3, 4]), B4],
        [tensor("INPUT0", "fp32", [1, 4], [1, 2, 3, 4]), B4],
        [tensor("INPUT0", 5, [1, 4], [1, 2, 3, 4]), B4],
        [tensor("INPUT0", "FP32", [1, 4], ["a", "b", "c", "d"]), B4],
        [tensor("INPUT0", "FP32", [1, 4], [10**400 // 10**360, 1, 1, 1]), B4],
        [tensor("INPUT0", "FP32", [1, 4], {"a": 1}), B4],
        [tensor("INPUT0", "FP32", [1, 4]), B4],
        [A4, A4, B4],
        [tensor(5, "FP32", [1, 4], [1, 2, 3, 4]), B4],
        [tensor("INPUT0", "FP32", [0, 4], []), tensor("INPUT1", "FP32", [0, 4], [])],
    ],
)
def test_more_bad_tensors_are_400(v2: httpx.Client, inputs: list) -> None:
    assert_v2_error(v2.post("/v2/models/add_sub/infer", json={"inputs": inputs}), 400)


def _binary(header: dict, blobs: bytes, length: str | None = None) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(header).encode()
    return head + blobs, {
        "Inference-Header-Content-Length": str(len(head)) if length is None else length,
        "Content-Type": "application/octet-stream",
    }


@pytest.mark.parametrize(
    ("size", "blob"),
    [
        (-8, b"\0" * 16),
        ("16", b"\0" * 16),
        (16.0, b"\0" * 16),
        (8, b"\0" * 8),
        (10**20, b"\0" * 16),
        (None, b"\0" * 16),
    ],
)
def test_more_bad_binary_bodies_are_400(v2: httpx.Client, size: Any, blob: bytes) -> None:
    header = {"inputs": [tensor("INPUT0", "FP32", [1, 4], parameters={"binary_data_size": size}), B4]}
    body, headers = _binary(header, blob)
    assert_v2_error(v2.post("/v2/models/add_sub/infer", content=body, headers=headers), 400)


def test_bytes_length_prefixes_and_header_lengths(v2: httpx.Client) -> None:
    def text(blob: bytes, rows: int = 1) -> dict:
        return {"inputs": [tensor("TEXT", "BYTES", [rows, 1], parameters={"binary_data_size": len(blob)})]}

    for blob, rows in (
        (b"\x05\x00", 1),
        (struct.pack("<I", 1) + b"a" + struct.pack("<I", 0xFFFFFFFF), 2),
        (struct.pack("<I", 2) + b"abcd", 1),
        (struct.pack("<I", 2**31) + b"ab", 1),
    ):
        body, headers = _binary(text(blob, rows), blob)
        assert_v2_error(v2.post("/v2/models/text_echo/infer", content=body, headers=headers), 400)
    ok = struct.pack("<I", 2) + b"ab"
    for length in ("1e3", "0x10", "+10", "-0", "", "99999999999999999999999", "-1"):
        body, headers = _binary(text(ok), ok, length)
        assert_v2_error(v2.post("/v2/models/text_echo/infer", content=body, headers=headers), 400)
    body, headers = _binary(text(ok), ok)
    resp = v2.post("/v2/models/text_echo/infer", content=body, headers=headers)
    assert resp.status_code == 200, resp.text


# ----------------------------------------------------------------------------------- 20-21. streams and load

LONG = {"model": DEFAULT_MODEL, "prompt": "Tell me a very long story.", "max_tokens": 2000, "ignore_eos": True}


async def test_200_streams_cut_after_half_a_second_are_aborted(server: ServerProcess) -> None:
    """200 clients start streams and vanish after 0.5 s, whether or not their stream had started (most are still
    queued): every sequence is aborted, every KV block freed, and the next request is served within seconds."""

    async def cut(client: httpx.AsyncClient, i: int) -> None:
        body = {**LONG, "stream": True, "prompt": f"{i}: Tell me a very long story."}
        try:
            async with asyncio.timeout(0.5):
                async with client.stream("POST", "/v1/completions", json=body) as resp:
                    async for _ in resp.aiter_bytes():
                        pass
        except TimeoutError:
            pass

    limits = httpx.Limits(max_connections=250, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60, limits=limits) as client:
        await asyncio.gather(*(cut(client, i) for i in range(200)))
    assert await asyncio.to_thread(server.wait_idle, 60) == (0, 0, 0)
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        resp = await client.post("/v1/completions", json={"model": DEFAULT_MODEL, "prompt": "hi", "max_tokens": 2})
    assert resp.status_code == 200 and time.monotonic() - started < 30


def test_a_client_that_never_reads_is_bounded_and_aborted(tensors: ServerProcess) -> None:
    """A decoupled model that could stream forever, to a client that never reads: the server buffers a bounded
    amount (the model's generator waits for the client), then gives up on the stream (send timeout, 2 s here)."""
    proc = psutil.Process(tensors.proc.pid)
    before_rss = proc.memory_info().rss

    def finished() -> int:
        stats = httpx.get(tensors.base_url + "/v2/models/counter_stream/stats").json()["model_stats"][0]
        return stats["inference_stats"]["success"]["count"] + stats["inference_stats"]["fail"]["count"]

    before = finished()
    body = json.dumps({"IN": 10**9}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", tensors.port))
    try:
        sock.sendall(
            b"POST /v2/models/counter_stream/generate_stream HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        deadline = time.monotonic() + 60
        peak = 0
        while finished() == before:
            peak = max(peak, proc.memory_info().rss - before_rss)
            assert time.monotonic() < deadline, "the stream to a reader that never reads was never given up"
            time.sleep(0.2)
        assert peak < 200 * (1 << 20), f"the server buffered {peak >> 20} MiB for one unread stream"
        received = 0
        while part := sock.recv(1 << 20):  # what the socket buffers held, then the server's close
            received += len(part)
            assert received < 64 * (1 << 20)
    finally:
        sock.close()
    resp = httpx.post(tensors.base_url + "/v2/models/counter_stream/generate_stream", json={"IN": 3}, timeout=30)
    assert resp.status_code == 200 and resp.text.count("data:") == 3


def test_burst_far_beyond_capacity_sheds_with_429(tensors: ServerProcess) -> None:
    """queue_probe runs one request at a time with one waiting: 60 at once get 429 with Retry-After, except the
    admitted ones, which finish with their own answers."""

    def call(i: int) -> tuple[int, httpx.Response]:
        body = {"inputs": [tensor("X", "INT64", [1, 1], [i]), tensor("DELAY_MS", "INT32", [1, 1], [200])]}
        return i, httpx.post(tensors.base_url + "/v2/models/queue_probe/infer", json=body, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(30) as pool:
        results = list(pool.map(call, range(60)))
    codes = [r.status_code for _, r in results]
    assert set(codes) <= {200, 429}, codes
    assert codes.count(200) >= 2 and codes.count(429) >= 30, codes
    for i, resp in results:
        if resp.status_code == 200:
            assert resp.json()["outputs"][0]["data"] == [i * 10]
        else:
            assert "queue is full" in assert_v2_error(resp, 429)
            assert int(resp.headers["retry-after"]) >= 1
    assert call(7)[1].status_code == 200


# ------------------------------------------------------------------------------------ 23-24. faults, reloads


def _in(value: int) -> dict:
    return {"inputs": [tensor("IN", "INT32", [1], [value])]}


def test_backend_failing_on_every_call(v2: httpx.Client) -> None:
    for _ in range(3):
        message = assert_v2_error(v2.post("/v2/models/always_fails/infer", json=_in(1)), 500)
        assert "always_fails" in message
        ok = v2.post("/v2/models/add_sub/versions/1/infer", json={"inputs": [A4, B4]})  # others continue
        assert ok.status_code == 200 and ok.json()["outputs"][0]["data"] == [2, 3, 4, 5]
    stats = v2.get("/v2/models/always_fails/stats").json()["model_stats"][0]["inference_stats"]
    assert stats["fail"]["count"] >= 3 and stats["success"]["count"] == 0  # the statistics show it
    assert v2.get("/v2/health/ready").status_code == 200  # the server itself stays ready


def test_backend_failing_on_the_eleventh_call(v2: httpx.Client) -> None:
    statuses = []
    for i in range(1, 16):
        resp = v2.post("/v2/models/eleventh_fails/infer", json=_in(i))
        statuses.append(resp.status_code)
        if resp.status_code == 200:
            assert resp.json()["outputs"][0]["data"] == [2 * i]
        else:
            assert_v2_error(resp, 500)
    assert statuses == [200] * 10 + [500] + [200] * 4


def _slow(delay_ms: int) -> dict:
    return {"inputs": [tensor("DELAY_MS", "INT32", [1], [delay_ms])]}


def test_reload_while_requests_are_in_flight(tensors: ServerProcess) -> None:
    url = tensors.base_url + "/v2/models/slow_tag/infer"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        in_flight = [pool.submit(httpx.post, url, json=_slow(800), timeout=60) for _ in range(4)]
        time.sleep(0.3)
        reload = httpx.post(
            tensors.base_url + "/v2/repository/models/slow_tag/load",
            headers=ADMIN,
            timeout=60,
            json={"parameters": {"config": json.dumps(slow_tag_config("2"))}},
        )
        assert reload.status_code == 200, reload.text
        fresh = httpx.post(url, json=_slow(0), timeout=60)
        assert fresh.status_code == 200 and fresh.json()["outputs"][0]["data"] == [2]  # the new version answers
        for future in in_flight:
            resp = future.result(timeout=60)  # none hangs
            if resp.status_code == 200:
                assert resp.json()["outputs"][0]["data"] in ([1], [2])
            else:
                assert_v2_error(resp, 503)
    restore = httpx.post(
        tensors.base_url + "/v2/repository/models/slow_tag/load",
        headers=ADMIN,
        timeout=60,
        json={"parameters": {"config": json.dumps(slow_tag_config("1"))}},
    )
    assert restore.status_code == 200


def test_unload_while_requests_are_in_flight(tensors: ServerProcess) -> None:
    url = tensors.base_url + "/v2/models/slow_tag/infer"
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            in_flight = [pool.submit(httpx.post, url, json=_slow(800), timeout=60) for _ in range(3)]
            time.sleep(0.3)
            unload = httpx.post(tensors.base_url + "/v2/repository/models/slow_tag/unload", headers=ADMIN, timeout=60)
            assert unload.status_code == 200, unload.text
            assert_v2_error(httpx.post(url, json=_slow(0), timeout=60), (404, 503))  # new requests: a clean error
            for future in in_flight:
                resp = future.result(timeout=60)
                if resp.status_code != 200:
                    assert_v2_error(resp, 503)
    finally:
        load = httpx.post(tensors.base_url + "/v2/repository/models/slow_tag/load", headers=ADMIN, timeout=60)
        assert load.status_code == 200, load.text
    assert httpx.post(url, json=_slow(0), timeout=60).status_code == 200


# ----------------------------------------------------------------------------------------------- afterwards


def test_both_servers_still_serve_real_work(http: httpx.Client, v2: httpx.Client) -> None:
    resp = http.post(
        "/v1/chat/completions",
        json={
            "model": DEFAULT_MODEL,
            "temperature": 0,
            "max_tokens": 12,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
        },
    )
    assert resp.status_code == 200 and "Paris" in resp.json()["choices"][0]["message"]["content"]
    assert http.get("/health").json() == {"status": "ok"}
    resp = v2.post("/v2/models/add_sub/infer", json={"inputs": [A4, B4]})
    assert resp.status_code == 200 and resp.json()["outputs"][1]["data"] == [0, 1, 2, 3]
