"""Every v2 model of the default repository answers tritonclient.http with JSON and binary tensors."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import ServerProcess

HELLO_GOLDEN = [-0.03447727, 0.0310232, 0.00673498, 0.02610899, -0.03936202, -0.16030248]


@pytest.fixture(scope="module")
def client(server: ServerProcess):
    c = httpclient.InferenceServerClient(server.base_url.removeprefix("http://"))
    yield c
    c.close()


@pytest.mark.parametrize("binary", [True, False])
def test_minilm_over_v2(client: httpclient.InferenceServerClient, binary: bool) -> None:
    meta = client.get_model_metadata("all-minilm-l6-v2")
    assert meta["platform"] == "transformers" and meta["outputs"][0] == {
        "name": "EMBEDDING",
        "datatype": "FP32",
        "shape": [-1, 384],
    }
    text = httpclient.InferInput("TEXT", [2, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"hello world"], [b"hello world"]], dtype=object), binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("EMBEDDING", "TOKEN_COUNT")]
    result = client.infer("all-minilm-l6-v2", [text], outputs=outputs)
    emb = result.as_numpy("EMBEDDING")
    assert emb.shape == (2, 384) and emb.dtype == np.float32
    np.testing.assert_allclose(emb[0, :6], HELLO_GOLDEN, atol=1e-5)
    assert result.as_numpy("TOKEN_COUNT").ravel().tolist() == [4, 4]


@pytest.mark.parametrize("binary", [True, False])
def test_circle_classifier_over_v2(client: httpclient.InferenceServerClient, binary: bool) -> None:
    points = httpclient.InferInput("FEATURES", [4, 2], "FP32")
    points.set_data_from_numpy(np.array([[0, 0], [0.5, 0.5], [1.5, 0], [-2, 2]], dtype=np.float32), binary_data=binary)
    out = httpclient.InferRequestedOutput("PROBABILITIES", binary_data=binary)
    probs = client.infer("circle_classifier", [points], outputs=[out]).as_numpy("PROBABILITIES")
    assert probs.argmax(1).tolist() == [1, 1, 0, 0]  # [outside, inside] per row
    assert client.get_model_config("circle_classifier")["platform"] == "onnxruntime_onnx"


def test_circle_forest_equals_treelite(client: httpclient.InferenceServerClient) -> None:
    import treelite

    from tests.conftest import ROOT

    points = np.array([[0, 0], [0.5, 0.5], [1.5, 0], [-2, 2]], dtype=np.float32)
    tensor = httpclient.InferInput("input__0", [4, 2], "FP32")
    tensor.set_data_from_numpy(points)
    got = client.infer("circle_forest", [tensor]).as_numpy("output__0")
    forest = treelite.Model.deserialize(str(ROOT / "model_repository" / "circle_forest" / "1" / "checkpoint.tl"))
    assert np.array_equal(got, treelite.gtil.predict(forest, points).reshape(4, 1).astype(np.float32))
    assert (got.ravel() > 0.5).tolist() == [True, True, False, False]
    assert client.get_model_metadata("circle_forest")["platform"] == "fil"
