"""The LLM over the v2 protocol: generate / generate_stream (HTTP), infer with text tensors, and gRPC stream
infer with streamed text -- all must agree with /v1/completions on greedy output."""

from __future__ import annotations

import json
import queue

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import DEFAULT_MODEL, ServerProcess

PROMPT = "The capital of France is"
GREEDY = {"max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def http(kserve_server: ServerProcess):
    with httpx.Client(base_url=kserve_server.base_url, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def reference(http: httpx.Client) -> str:
    resp = http.post("/v1/completions", json={"model": DEFAULT_MODEL, "prompt": PROMPT, **GREEDY})
    assert resp.status_code == 200, resp.text
    text = resp.json()["choices"][0]["text"]
    assert text
    return text


def test_generate_and_stream_match_completions(http: httpx.Client, reference: str) -> None:
    resp = http.post(f"/v2/models/{DEFAULT_MODEL}/generate", json={"text_input": PROMPT, "parameters": GREEDY})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model_name"] == DEFAULT_MODEL and body["text_output"] == reference
    top_level = http.post(f"/v2/models/{DEFAULT_MODEL}/generate", json={"text_input": PROMPT, **GREEDY})
    assert top_level.json()["text_output"] == reference  # Triton's TRT-LLM style: settings as top-level fields
    with http.stream(
        "POST", f"/v2/models/{DEFAULT_MODEL}/generate_stream", json={"text_input": PROMPT, "parameters": GREEDY}
    ) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[5:]) for line in stream.iter_lines() if line.startswith("data:")]
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == reference


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"parameters": GREEDY}, "text_input"),
        ({"text_input": ""}, "text_input"),
        ({"text_input": "hi", "max_tokens": 0}, "max_tokens"),
        ({"text_input": "hi", "temperature": -1}, "temperature"),
        ({"text_input": "hi", "max_tokens": 10**9}, "context"),
        ({"text_input": "hi", "stop": ["x"] * 100}, "stop"),
        ({"text_input": "hi", "bad_words": "x"}, "unexpected field"),
        ({"text_input": "hi", "parameters": {"top_p": "high"}}, "top_p"),
    ],
)
def test_bad_generate_requests(http: httpx.Client, body: dict, fragment: str) -> None:
    for route in ("generate", "generate_stream"):
        resp = http.post(f"/v2/models/{DEFAULT_MODEL}/{route}", json=body)
        assert resp.status_code == 400, resp.text
        assert fragment in resp.json()["error"]


def test_llm_metadata_and_http_infer(kserve_server: ServerProcess, reference: str) -> None:
    client = httpclient.InferenceServerClient(kserve_server.base_url.removeprefix("http://"))
    meta = client.get_model_metadata(DEFAULT_MODEL)
    assert meta["inputs"][0] == {"name": "text_input", "datatype": "BYTES", "shape": [1]}
    assert client.get_model_config(DEFAULT_MODEL)["model_transaction_policy"] == {"decoupled": True}
    text = httpclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
    max_tokens = httpclient.InferInput("max_tokens", [1], "INT32")
    max_tokens.set_data_from_numpy(np.array([12], dtype=np.int32))
    result = client.infer(DEFAULT_MODEL, [text, max_tokens], parameters={"temperature": 0.0})
    assert result.as_numpy("text_output")[0].decode() == reference
    client.close()


def test_grpc_stream_infer_streams_text(kserve_server: ServerProcess, reference: str) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{kserve_server.grpc_port}")  # type: ignore[attr-defined]
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
        stream = grpcclient.InferInput("stream", [1], "BOOL")
        stream.set_data_from_numpy(np.array([True]))
        client.async_stream_infer(
            DEFAULT_MODEL, [text, stream], request_id="llm", parameters=GREEDY, enable_empty_final_response=True
        )
        pieces = []
        while True:
            result, error = responses.get(timeout=300)
            assert error is None, error
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                break
            pieces.append(result.as_numpy("text_output")[0].decode())
        assert len(pieces) > 1 and "".join(pieces) == reference
    finally:
        client.stop_stream()
    whole = grpcclient.InferInput("text_input", [1], "BYTES")
    whole.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
    result = client.infer(DEFAULT_MODEL, [whole], parameters=GREEDY)
    assert result.as_numpy("text_output")[0].decode() == reference
    client.close()
