"""Stateful sequences (sequence batcher with implicit state and controls) and ensembles, over tritonclient."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess


@pytest.fixture(scope="module")
def client(kserve_server: ServerProcess):
    c = httpclient.InferenceServerClient(kserve_server.base_url.removeprefix("http://"), concurrency=8)
    yield c
    c.close()


def step(client, value: int, sequence_id, start: bool = False, end: bool = False) -> tuple[int, int]:
    tensor = httpclient.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    result = client.infer("accumulator", [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUT")[0, 0]), int(result.as_numpy("CALLS")[0, 0])


def test_interleaved_sequences_keep_separate_state(client: httpclient.InferenceServerClient) -> None:
    assert step(client, 5, 101, start=True) == (5, 1)
    assert step(client, 100, 202, start=True) == (100, 1)
    assert step(client, 3, 303, start=True) == (3, 1)
    assert step(client, 1, 101) == (6, 2)
    assert step(client, 10, 202) == (110, 2)
    assert step(client, 2, 101) == (8, 3)
    assert step(client, 4, 303, end=True) == (7, 2)
    assert step(client, 1, 202, end=True) == (111, 3)
    with pytest.raises(InferenceServerException, match="not active"):
        step(client, 1, 303)  # ended
    assert step(client, 1, 101, end=True) == (9, 4)
    assert step(client, 7, 303, start=True) == (7, 1)  # the id can start again, from fresh state
    step(client, 0, 303, end=True)


def test_concurrent_sequences_over_grpc(kserve_server: ServerProcess) -> None:
    def run(sequence_id: int) -> list[int]:
        c = grpcclient.InferenceServerClient(f"127.0.0.1:{kserve_server.grpc_port}")  # type: ignore[attr-defined]
        totals = []
        for i in range(1, 6):
            tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[sequence_id * i]], dtype=np.int32))
            result = c.infer(
                "accumulator", [tensor], sequence_id=sequence_id, sequence_start=i == 1, sequence_end=i == 5
            )
            totals.append(int(result.as_numpy("OUT")[0, 0]))
            assert int(result.as_numpy("CALLS")[0, 0]) == i  # never moved to another instance
        c.close()
        return totals

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = dict(zip(range(1, 7), pool.map(run, range(1, 7)), strict=True))
    for sequence_id, totals in results.items():
        assert totals == [sequence_id * n * (n + 1) // 2 for n in range(1, 6)]


def test_sequence_errors_and_idle_release(
    client: httpclient.InferenceServerClient, kserve_server: ServerProcess
) -> None:
    with httpx.Client(base_url=kserve_server.base_url, timeout=30) as http:
        body = {"inputs": [{"name": "IN", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}
        resp = http.post("/v2/models/accumulator/infer", json=body)
        assert resp.status_code == 400 and "sequence_id" in resp.json()["error"]
        resp = http.post(
            "/v2/models/accumulator/infer",
            json={**body, "parameters": {"sequence_id": "named", "sequence_start": True}},
        )
        assert resp.status_code == 400 and "integer" in resp.json()["error"]
        resp = http.post(
            "/v2/models/accumulator/infer", json={**body, "parameters": {"sequence_id": 9, "sequence_start": "yes"}}
        )
        assert resp.status_code == 400 and "sequence_start" in resp.json()["error"]
    assert step(client, 2, 404, start=True) == (2, 1)
    time.sleep(1.6)  # max_sequence_idle_microseconds is 1 s
    with pytest.raises(InferenceServerException, match="not active"):
        step(client, 1, 404)
    config = client.get_model_config("accumulator")["sequence_batching"]
    assert config["control_input"][3]["control"][0] == {
        "kind": "CONTROL_SEQUENCE_CORRID",
        "data_type": "TYPE_UINT64",
        "int32_false_true": [],
        "fp32_false_true": [],
        "bool_false_true": [],
    }
    assert config["state"][0]["data_type"] == "TYPE_INT32"


@pytest.mark.parametrize("binary", [True, False])
def test_ensemble_runs_the_whole_pipeline(client: httpclient.InferenceServerClient, binary: bool) -> None:
    text = httpclient.InferInput("TEXT", [3, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"0.1, 0.2"], [b"1.8, -1.7"], [b"-0.5;0.5"]], dtype=object), binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("LABEL", "SCORE")]
    result = client.infer("circle_pipeline", [text], outputs=outputs)
    labels = [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy("LABEL").ravel()]
    assert labels == ["inside", "outside", "inside"]
    scores = result.as_numpy("SCORE").ravel()
    assert scores.shape == (3,) and (scores > 0.5).all()
    forest = client.infer("circle_pipeline", [text], outputs=[httpclient.InferRequestedOutput("FOREST_SCORE")])
    assert (forest.as_numpy("FOREST_SCORE").ravel() > 0.5).tolist() == [True, False, True]  # the forest agrees
    assert client.get_model_metadata("circle_pipeline")["platform"] == "ensemble"
    steps = client.get_inference_statistics("circle_preprocess")["model_stats"][0]
    assert steps["inference_count"] >= 3  # the step models really ran


def test_ensemble_errors_come_from_the_failing_step(kserve_server: ServerProcess) -> None:
    with httpx.Client(base_url=kserve_server.base_url, timeout=30) as http:
        body = {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["not numbers"]}]}
        resp = http.post("/v2/models/circle_pipeline/infer", json=body)
        assert resp.status_code == 400 and "x, y" in resp.json()["error"]


def test_ensemble_over_grpc(kserve_server: ServerProcess) -> None:
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{kserve_server.grpc_port}")  # type: ignore[attr-defined]
    text = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"0, 0"]], dtype=object))
    assert c.infer("circle_pipeline", [text]).as_numpy("LABEL").ravel().tolist() == [b"inside"]
    config = c.get_model_config("circle_pipeline").config
    assert [s.model_name for s in config.ensemble_scheduling.step] == [
        "circle_preprocess",
        "circle_classifier",
        "circle_postprocess",
        "circle_forest",
    ]
    c.close()
