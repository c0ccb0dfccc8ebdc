"""KServe v2 over HTTP with the real tritonclient.http against a real server (python, ONNX, TorchScript models)."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import struct

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ADMIN_HEADERS, ServerProcess


@pytest.fixture(scope="module")
def client(kserve_server: ServerProcess):
    c = httpclient.InferenceServerClient(kserve_server.base_url.removeprefix("http://"), concurrency=16)
    yield c
    c.close()


@pytest.fixture(scope="module")
def http(kserve_server: ServerProcess):
    with httpx.Client(base_url=kserve_server.base_url, timeout=60, headers=ADMIN_HEADERS) as c:
        yield c


def add_sub_inputs(a: np.ndarray, b: np.ndarray, binary: bool = True) -> list[httpclient.InferInput]:
    inputs = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        tensor = httpclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    return inputs


def assert_v2_error(resp: httpx.Response, status: int, fragment: str = "") -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"]
    assert fragment.lower() in body["error"].lower(), body["error"]
    assert "Traceback" not in body["error"] and "/tmp/" not in body["error"]
    return body["error"]


def test_server_health_and_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "switchyard"
    assert {"binary_tensor_data", "model_repository", "statistics"} <= set(meta["extensions"])


def test_model_metadata_config_and_versions(client: httpclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata("add_sub")
    assert meta["versions"] == ["1", "2"] and meta["platform"] == "python"
    assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}
    assert client.is_model_ready("add_sub") and client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("add_sub", "3")
    assert not client.is_model_ready("no_such_model")
    config = client.get_model_config("add_sub")
    assert config["max_batch_size"] == 8 and config["backend"] == "python"
    assert config["input"][1] == {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4], "optional": False}
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 100000
    assert config["version_policy"] == {"all": {}}
    with pytest.raises(InferenceServerException, match="version"):
        client.get_model_metadata("add_sub", "7")


@pytest.mark.parametrize("binary", [True, False])
def test_infer_add_sub_json_and_binary(client: httpclient.InferenceServerClient, binary: bool) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), dtype=np.float32)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("add_sub", add_sub_inputs(a, b, binary), outputs=outputs, model_version="1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response()["model_version"] == "1"
    latest = client.infer("add_sub", add_sub_inputs(a, b, binary))  # no version: the latest (2) answers
    assert latest.get_response()["model_version"] == "2"
    np.testing.assert_array_equal(latest.as_numpy("OUTPUT0"), a + b + 100)


def test_only_requested_outputs_come_back(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 4), dtype=np.float32)
    result = client.infer("add_sub", add_sub_inputs(a, a), outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 4), np.float32))


@pytest.mark.parametrize("binary", [True, False])
def test_bytes_tensors(client: httpclient.InferenceServerClient, binary: bool) -> None:
    texts = np.array([["héllo"], ["abc"], [""]], dtype=object)
    tensor = httpclient.InferInput("TEXT", [3, 1], "BYTES")
    tensor.set_data_from_numpy(texts, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("UPPER", "LENGTH")]
    result = client.infer("text_echo", [tensor], outputs=outputs)
    upper = [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy("UPPER").ravel()]  # JSON gives str
    assert upper == ["HéLLO!", "ABC!", "!"]
    assert result.as_numpy("LENGTH").ravel().tolist() == [6, 3, 0]


def test_onnx_and_torchscript_models(client: httpclient.InferenceServerClient) -> None:
    points = np.array([[0.0, 0.0], [1.9, -1.9], [0.3, 0.4]], dtype=np.float32)
    tensor = httpclient.InferInput("FEATURES", [3, 2], "FP32")
    tensor.set_data_from_numpy(points)
    probs = client.infer("circle_classifier", [tensor]).as_numpy("PROBABILITIES")
    assert probs.shape == (3, 2) and probs.argmax(1).tolist() == [1, 0, 1]  # inside, outside, inside
    assert client.get_model_metadata("circle_classifier")["platform"] == "onnxruntime_onnx"

    x = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    tensor = httpclient.InferInput("INPUT__0", [1, 3], "FP32")
    tensor.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("scale_shift", [tensor]).as_numpy("OUTPUT__0"), x * 2 + 1)


def probe_input(x: int, delay_ms: int = 0) -> list[httpclient.InferInput]:
    tx = httpclient.InferInput("X", [1, 1], "INT64")
    tx.set_data_from_numpy(np.array([[x]], dtype=np.int64))
    td = httpclient.InferInput("DELAY_MS", [1, 1], "INT32")
    td.set_data_from_numpy(np.array([[delay_ms]], dtype=np.int32))
    return [tx, td]


def test_concurrent_requests_are_batched(client: httpclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("batch_probe")["model_stats"][0]
    pending = [client.async_infer("batch_probe", probe_input(i, 20)) for i in range(12)]
    results = [p.get_result(timeout=60) for p in pending]
    for i, result in enumerate(results):
        assert result.as_numpy("Y").ravel().tolist() == [i * 10]  # each client got its own row back
    batched = [int(r.as_numpy("REQUESTS")[0, 0]) for r in results]
    assert max(batched) > 1, batched
    after = client.get_inference_statistics("batch_probe")["model_stats"][0]
    requests = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert requests == 12 and executions < requests
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 12
    assert any(b["batch_size"] > 1 for b in after["batch_stats"])


def test_statistics_shape(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 4), dtype=np.float32)
    client.infer("add_sub", add_sub_inputs(a, a), model_version="1")
    stats = client.get_inference_statistics("add_sub", "1")["model_stats"]
    assert len(stats) == 1 and stats[0]["version"] == "1" and stats[0]["inference_count"] >= 1
    assert stats[0]["last_inference"] > 0 and stats[0]["inference_stats"]["queue"]["count"] >= 1
    everything = client.get_inference_statistics()["model_stats"]
    assert {"add_sub", "text_echo", "batch_probe"} <= {s["name"] for s in everything}


def test_full_queue_is_refused_with_429(http: httpx.Client) -> None:
    body = {
        "inputs": [
            {"name": "X", "shape": [1, 1], "datatype": "INT64", "data": [1]},
            {"name": "DELAY_MS", "shape": [1, 1], "datatype": "INT32", "data": [400]},
        ]
    }
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(lambda _: http.post("/v2/models/queue_probe/infer", json=body), range(6)))
    codes = sorted(r.status_code for r in responses)
    assert codes.count(200) >= 2 and 429 in codes, codes
    refused = next(r for r in responses if r.status_code == 429)
    assert_v2_error(refused, 429, "queue is full")
    assert refused.headers.get("retry-after")


def test_queue_timeout_override_rejects(http: httpx.Client) -> None:
    slow = {
        "inputs": [
            {"name": "X", "shape": [1, 1], "datatype": "INT64", "data": [1]},
            {"name": "DELAY_MS", "shape": [1, 1], "datatype": "INT32", "data": [500]},
        ]
    }
    quick = {
        "parameters": {"timeout": 50_000},
        "inputs": [{"name": "X", "shape": [1, 1], "datatype": "INT64", "data": [2]}],
    }
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(http.post, "/v2/models/queue_probe/infer", json=slow)
        import time

        time.sleep(0.1)
        second = pool.submit(http.post, "/v2/models/queue_probe/infer", json=quick)
        assert first.result().status_code == 200
        assert_v2_error(second.result(), 503, "timed out")


def test_generate_on_tensor_and_decoupled_models(http: httpx.Client) -> None:
    resp = http.post("/v2/models/text_echo/generate", json={"TEXT": "hey"})
    assert resp.status_code == 200 and resp.json() == {
        "model_name": "text_echo",
        "model_version": "1",
        "UPPER": "HEY!",
        "LENGTH": 3,
    }
    with http.stream("POST", "/v2/models/counter_stream/generate_stream", json={"IN": 4}) as stream:
        events = [json.loads(line[5:]) for line in stream.iter_lines() if line.startswith("data:")]
    assert [e["OUT"] for e in events] == [0, 1, 2, 3]
    assert_v2_error(
        http.post(
            "/v2/models/counter_stream/infer",
            json={"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [2]}]},
        ),
        400,
        "decoupled",
    )
    assert_v2_error(http.post("/v2/models/text_echo/generate", json={"NOPE": 1}), 400, "unexpected field")


def test_model_errors_are_contained(http: httpx.Client) -> None:
    def call(value: int) -> httpx.Response:
        return http.post(
            "/v2/models/flaky/infer",
            json={"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [value]}]},
        )

    message = assert_v2_error(call(13), 500, "failed to execute")
    assert "secret" not in message and "/opt/" not in message
    assert_v2_error(call(-1), 400, "non-negative")
    ok = call(4)
    assert ok.status_code == 200 and ok.json()["outputs"][0]["data"] == [8]


def _tensor(name: str, datatype: str, shape: list[int], data: list) -> dict:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


A4 = _tensor("INPUT0", "FP32", [1, 4], [1, 2, 3, 4])
B4 = _tensor("INPUT1", "FP32", [1, 4], [1, 1, 1, 1])


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"inputs": [_tensor("INPUT0", "FP32", [1, 4], [1, 2, 3]), B4]}, "needs 4"),
        ({"inputs": [_tensor("INPUT0", "FP99", [1, 4], [1, 2, 3, 4]), B4]}, "unknown datatype"),
        ({"inputs": [_tensor("INPUT0", "FP64", [1, 4], [1, 2, 3, 4]), B4]}, "does not match"),
        ({"inputs": [_tensor("INPUT0", "FP32", [1, 2, 2], [1, 2, 3, 4]), B4]}, "does not match"),
        (
            {"inputs": [_tensor("INPUT0", "FP32", [9, 4], [0] * 36), _tensor("INPUT1", "FP32", [9, 4], [0] * 36)]},
            "max_batch_size",
        ),
        ({"inputs": [A4]}, "needs input"),
        ({"inputs": [A4, B4, _tensor("EXTRA", "FP32", [1], [1])]}, "unexpected input"),
        ({"inputs": [A4, B4], "outputs": [{"name": "NOPE"}]}, "no output"),
        ({"inputs": "x"}, "inputs"),
        ({"inputs": [A4, B4], "parameters": {"priority": "high"}}, "priority"),
    ],
)
def test_bad_tensors_are_400(http: httpx.Client, body: dict, fragment: str) -> None:
    assert_v2_error(http.post("/v2/models/add_sub/infer", json=body), 400, fragment)


def binary_request(header: dict, blobs: bytes, header_length: int | str | None = None) -> tuple[bytes, dict]:
    head = json.dumps(header).encode()
    length = len(head) if header_length is None else header_length
    return head + blobs, {"Inference-Header-Content-Length": str(length), "Content-Type": "application/octet-stream"}


def test_bad_binary_bodies_are_400(http: httpx.Client) -> None:
    text = {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": 8}}]}
    lying = struct.pack("<I", 1000) + b"abcd"  # claims 1000 bytes, has 4
    body, headers = binary_request(text, lying)
    assert_v2_error(http.post("/v2/models/text_echo/infer", content=body, headers=headers), 400, "claims")
    text["inputs"][0]["parameters"]["binary_data_size"] = 100  # larger than the body
    body, headers = binary_request(text, lying)
    assert_v2_error(http.post("/v2/models/text_echo/infer", content=body, headers=headers), 400, "larger than")
    for bad_length in (10**6, -5, "abc"):
        body, headers = binary_request(text, lying, bad_length)
        assert_v2_error(
            http.post("/v2/models/text_echo/infer", content=body, headers=headers),
            400,
            "Inference-Header-Content-Length",
        )
    assert_v2_error(
        http.post("/v2/models/add_sub/infer", content=b"{nope", headers={"Content-Type": "application/json"}),
        400,
        "JSON",
    )


def test_gzip_request_bodies(http: httpx.Client) -> None:
    import gzip

    body = gzip.compress(json.dumps({"inputs": [A4, B4]}).encode())
    resp = http.post("/v2/models/add_sub/versions/1/infer", content=body, headers={"Content-Encoding": "gzip"})
    assert resp.status_code == 200 and resp.json()["outputs"][0]["data"] == [2, 3, 4, 5]
    bomb = gzip.compress(b"\0" * (40 * 1024 * 1024))  # inflates past the 32 MiB body limit
    assert_v2_error(
        http.post("/v2/models/add_sub/infer", content=bomb, headers={"Content-Encoding": "gzip"}), 400, "limit"
    )


def test_unknown_model_and_route(http: httpx.Client) -> None:
    assert_v2_error(http.post("/v2/models/nope/infer", json={"inputs": []}), 404, "nope")
    assert_v2_error(http.get("/v2/models/nope"), 404)
    assert_v2_error(http.get("/v2/nothing/here"), 404)


def test_repository_index_unload_and_load(client: httpclient.InferenceServerClient, http: httpx.Client) -> None:
    index = {
        (m["name"], m.get("version", "")): m["state"] for m in client.get_model_repository_index(headers=ADMIN_HEADERS)
    }
    assert index[("add_sub", "1")] == "READY" and index[("add_sub", "2")] == "READY"
    client.unload_model("text_echo", headers=ADMIN_HEADERS)
    assert not client.is_model_ready("text_echo")
    rows = [m for m in client.get_model_repository_index(headers=ADMIN_HEADERS) if m["name"] == "text_echo"]
    assert rows == [{"name": "text_echo", "version": "", "state": "UNAVAILABLE", "reason": "unloaded"}]
    assert_v2_error(http.post("/v2/models/text_echo/generate", json={"TEXT": "x"}), 404)
    client.load_model("text_echo", headers=ADMIN_HEADERS)
    assert client.is_model_ready("text_echo")
    assert http.post("/v2/models/text_echo/generate", json={"TEXT": "x"}).json()["UPPER"] == "X!"
    # reload with a config override: a new parameter value, same files
    override = {
        "backend": "python",
        "max_batch_size": 4,
        "parameters": {"suffix": "?"},
        "input": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]}],
        "output": [
            {"name": "UPPER", "data_type": "TYPE_STRING", "dims": [1]},
            {"name": "LENGTH", "data_type": "TYPE_INT32", "dims": [1]},
        ],
    }
    client.load_model("text_echo", config=json.dumps(override), headers=ADMIN_HEADERS)
    assert http.post("/v2/models/text_echo/generate", json={"TEXT": "x"}).json()["UPPER"] == "X?"
    assert client.get_model_config("text_echo")["max_batch_size"] == 4
    client.load_model("text_echo", headers=ADMIN_HEADERS)  # back to the file's config
    assert http.post("/v2/models/text_echo/generate", json={"TEXT": "x"}).json()["UPPER"] == "X!"


def test_bad_load_requests(http: httpx.Client) -> None:
    assert_v2_error(http.post("/v2/repository/models/missing_model/load"), 404)
    bad = {"parameters": {"config": json.dumps({"backend": "python", "max_batch_size": -1})}}
    assert_v2_error(http.post("/v2/repository/models/text_echo/load", json=bad), 400, "max_batch_size")
    sneaky = {"parameters": {"config": json.dumps({"backend": "python", "model": "/etc"})}}
    assert_v2_error(http.post("/v2/repository/models/text_echo/load", json=sneaky), 400, "may not set 'model'")
    files = {"parameters": {"file:1/model.py": "aW1wb3J0IG9z"}}
    assert_v2_error(http.post("/v2/repository/models/text_echo/load", json=files), 400, "file")
    assert http.post("/v2/models/text_echo/generate", json={"TEXT": "x"}).status_code == 200  # still serving


@pytest.mark.parametrize(
    "name", ["%2e%2e", "%2e%2e%2fetc", "a%2f..%2fb", "%2fetc%2fpasswd", "bad%00name", "..%2f..%2fetc"]
)
def test_repository_names_cannot_escape(http: httpx.Client, name: str) -> None:
    for action in ("load", "unload"):
        resp = http.post(f"/v2/repository/models/{name}/{action}")
        assert resp.status_code == 400, (name, resp.status_code, resp.text)
        assert "error" in resp.json()


def test_raw_traversal_paths_are_refused(kserve_server: ServerProcess) -> None:
    """Paths a normalising client would rewrite, sent verbatim."""
    for path in (
        b"/v2/repository/models/../load",
        b"/v2/repository/models/../etc/load",
        b"/v2/repository/models/a/../b/load",
        b"/v2/repository/models//etc/passwd/load",
    ):
        with socket.create_connection(("127.0.0.1", kserve_server.port), timeout=10) as sock:
            sock.sendall(b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
        assert reply.split(b"\r\n", 1)[0] == b"HTTP/1.1 400 Bad Request", (path, reply[:200])


def test_symlink_escape_is_refused(kserve_repository, http: httpx.Client, tmp_path) -> None:
    outside = tmp_path / "outside_model"
    (outside / "1").mkdir(parents=True)
    (outside / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 0\n')
    link = kserve_repository / "escaper"
    link.symlink_to(outside, target_is_directory=True)
    try:
        assert_v2_error(http.post("/v2/repository/models/escaper/load"), 400, "leaves the repository")
        assert all(m["name"] != "escaper" for m in http.post("/v2/repository/index").json())
    finally:
        link.unlink()
