"""KServe v2 over gRPC with the real tritonclient.grpc against a real server."""

from __future__ import annotations

import json
import queue
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ADMIN_HEADERS, ServerProcess


@pytest.fixture(scope="module")
def client(kserve_server: ServerProcess):
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{kserve_server.grpc_port}")  # type: ignore[attr-defined]
    yield c
    c.close()


def fp32_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def test_health_and_server_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "switchyard" and "binary_tensor_data" in meta["extensions"]


def test_model_metadata_config_ready(client: grpcclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata("add_sub", as_json=True)
    assert meta["versions"] == ["1", "2"]
    assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "4"]}  # int64 as JSON strings
    assert client.is_model_ready("add_sub") and client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("add_sub", "9") and not client.is_model_ready("missing")
    config = client.get_model_config("add_sub").config  # the protobuf ModelConfig itself
    assert config.name == "add_sub" and config.max_batch_size == 8 and config.backend == "python"
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    assert config.input[0].data_type == 11 and list(config.input[0].dims) == [4]  # TYPE_FP32
    assert config.dynamic_batching.max_queue_delay_microseconds == 100000
    assert config.version_policy.WhichOneof("policy_choice") == "all"
    text_config = client.get_model_config("text_echo", as_json=True)["config"]
    assert text_config["input"][0]["data_type"] == "TYPE_STRING"
    assert text_config["parameters"]["suffix"]["string_value"] == "!"
    assert text_config["dynamic_batching"]["preferred_batch_size"] == [4, 8]


def test_infer_with_raw_contents_and_versions(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full((2, 4), 0.5, dtype=np.float32)
    result = client.infer("add_sub", fp32_inputs(a, b), model_version="1", request_id="r-1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response.model_version == "1" and response.id == "r-1"
    latest = client.infer("add_sub", fp32_inputs(a, b), outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
    assert latest.get_response().model_version == "2" and latest.as_numpy("OUTPUT1") is None
    np.testing.assert_array_equal(latest.as_numpy("OUTPUT0"), a + b + 100)


def test_bytes_and_onnx(client: grpcclient.InferenceServerClient) -> None:
    text = grpcclient.InferInput("TEXT", [2, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"grpc"], ["\u00fcber".encode()]], dtype=object))
    result = client.infer("text_echo", [text])
    assert result.as_numpy("UPPER").ravel().tolist() == [b"GRPC!", "\u00fcBER!".encode()]
    assert result.as_numpy("LENGTH").ravel().tolist() == [4, 5]
    points = grpcclient.InferInput("FEATURES", [2, 2], "FP32")
    points.set_data_from_numpy(np.array([[0.1, 0.1], [-1.8, 1.7]], dtype=np.float32))
    assert client.infer("circle_classifier", [points]).as_numpy("PROBABILITIES").argmax(1).tolist() == [1, 0]


def test_async_infer_is_batched(client: grpcclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("batch_probe", as_json=True)["model_stats"][0]
    done: queue.Queue = queue.Queue()
    for i in range(10):
        x = grpcclient.InferInput("X", [1, 1], "INT64")
        x.set_data_from_numpy(np.array([[i]], dtype=np.int64))
        client.async_infer("batch_probe", [x], callback=lambda result, error, i=i: done.put((i, result, error)))
    results = [done.get(timeout=60) for _ in range(10)]
    for i, result, error in results:
        assert error is None, error
        assert result.as_numpy("Y").ravel().tolist() == [i * 10]
    after = client.get_inference_statistics("batch_probe", as_json=True)["model_stats"][0]
    executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
    assert int(after["inference_count"]) - int(before.get("inference_count", 0)) == 10
    assert executions < 10


def test_errors_map_to_status_codes(client: grpcclient.InferenceServerClient) -> None:
    a = np.ones((1, 3), dtype=np.float32)
    with pytest.raises(InferenceServerException) as bad_shape:
        client.infer("add_sub", fp32_inputs(a, a))
    assert bad_shape.value.status() == "StatusCode.INVALID_ARGUMENT" and "shape" in bad_shape.value.message()
    with pytest.raises(InferenceServerException) as missing:
        client.infer("nope", fp32_inputs(a, a))
    assert missing.value.status() == "StatusCode.NOT_FOUND"
    boom = grpcclient.InferInput("IN", [1], "INT32")
    boom.set_data_from_numpy(np.array([13], dtype=np.int32))
    with pytest.raises(InferenceServerException) as internal:
        client.infer("flaky", [boom])
    assert internal.value.status() == "StatusCode.INTERNAL" and "secret" not in internal.value.message()
    with pytest.raises(InferenceServerException) as unimplemented:
        client.get_system_shared_memory_status()
    assert unimplemented.value.status() == "StatusCode.UNIMPLEMENTED"


def test_stream_infer_on_decoupled_model(client: grpcclient.InferenceServerClient) -> None:
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        for n, rid in ((3, "a"), (2, "b")):
            value = grpcclient.InferInput("IN", [1], "INT32")
            value.set_data_from_numpy(np.array([n], dtype=np.int32))
            client.async_stream_infer("counter_stream", [value], request_id=rid, enable_empty_final_response=True)
        got: dict[str, list[int]] = {"a": [], "b": []}
        finals = 0
        while finals < 2:
            result, error = responses.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                finals += 1
                continue
            got[response.id].append(int(result.as_numpy("OUT")[0]))
        assert got == {"a": [0, 1, 2], "b": [0, 1]}
        bad = grpcclient.InferInput("IN", [1], "INT32")
        bad.set_data_from_numpy(np.array([-1], dtype=np.int32))
        client.async_stream_infer("counter_stream", [bad], request_id="c")
        _, error = responses.get(timeout=60)
        assert error is not None and "non-negative" in error.message()
        broken = grpcclient.InferInput("IN", [1], "INT32")
        broken.set_data_from_numpy(np.array([99], dtype=np.int32))
        client.async_stream_infer("counter_stream", [broken], request_id="d")
        first, error = responses.get(timeout=60)
        assert error is None and int(first.as_numpy("OUT")[0]) == 0
        _, error = responses.get(timeout=60)  # the generator raised after one response
        assert error is not None and "failed to execute" in error.message() and "secret" not in error.message()
    finally:
        client.stop_stream()


def test_stream_infer_on_ordinary_model(client: grpcclient.InferenceServerClient) -> None:
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        text = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"s"]], dtype=object))
        client.async_stream_infer("text_echo", [text], request_id="x")
        result, error = responses.get(timeout=60)
        assert error is None and result.as_numpy("UPPER").ravel().tolist() == [b"S!"]
        assert result.get_response().parameters["triton_final_response"].bool_param
    finally:
        client.stop_stream()


def test_repository_over_grpc(client: grpcclient.InferenceServerClient) -> None:
    index = client.get_model_repository_index(headers=ADMIN_HEADERS, as_json=True)["models"]
    assert {"name": "add_sub", "version": "1", "state": "READY"} in [
        {k: m.get(k, "") for k in ("name", "version", "state")} for m in index
    ]
    client.unload_model("scale_shift", headers=ADMIN_HEADERS)
    assert not client.is_model_ready("scale_shift")
    client.load_model("scale_shift", headers=ADMIN_HEADERS)
    assert client.is_model_ready("scale_shift")
    x = grpcclient.InferInput("INPUT__0", [2, 3], "FP32")
    x.set_data_from_numpy(np.ones((2, 3), dtype=np.float32))
    np.testing.assert_array_equal(
        client.infer("scale_shift", [x]).as_numpy("OUTPUT__0"), np.full((2, 3), 3.0, np.float32)
    )
    with pytest.raises(InferenceServerException) as escape:
        client.load_model("../etc", headers=ADMIN_HEADERS)
    assert escape.value.status() == "StatusCode.INVALID_ARGUMENT"
    with pytest.raises(InferenceServerException):
        client.load_model("scale_shift", config=json.dumps({"platform": "tensorflow_graphdef"}), headers=ADMIN_HEADERS)
    assert client.is_model_ready("scale_shift")  # a failed reload keeps the loaded copy


def test_statistics_over_grpc(client: grpcclient.InferenceServerClient) -> None:
    stats = client.get_inference_statistics("add_sub", "1").model_stats
    assert len(stats) == 1 and stats[0].inference_count >= 1 and stats[0].inference_stats.success.count >= 1
    names = {s.name for s in client.get_inference_statistics().model_stats}
    assert {"add_sub", "text_echo"} <= names


def test_concurrent_clients_threads(kserve_server: ServerProcess) -> None:
    """Several client connections at once each get their own answers."""
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            c = grpcclient.InferenceServerClient(f"127.0.0.1:{kserve_server.grpc_port}")  # type: ignore[attr-defined]
            a = np.full((1, 4), k, dtype=np.float32)
            out = c.infer("add_sub", fp32_inputs(a, a), model_version="1").as_numpy("OUTPUT0")
            assert out.tolist() == [[2.0 * k] * 4]
            c.close()
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
