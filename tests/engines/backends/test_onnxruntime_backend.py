"""The onnxruntime backend on the default repository's generated ONNX classifier, including auto-complete."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engines.backends import create_backend
from engines.types import TensorModelSpec, TensorSpec

MODEL = Path(__file__).resolve().parents[3] / "model_repository" / "circle_classifier"


def spec(**kw) -> TensorModelSpec:
    values = dict(
        name="circle_classifier",
        version=1,
        model_dir=str(MODEL),
        version_dir=str(MODEL / "1"),
        max_batch_size=64,
        inputs=[TensorSpec("FEATURES", "FP32", [2])],
        outputs=[TensorSpec("PROBABILITIES", "FP32", [2])],
    )
    values.update(kw)
    return TensorModelSpec(**values)


def test_batched_requests_are_split_back() -> None:
    backend = create_backend("onnxruntime")
    backend.load(spec())
    requests = [
        {"FEATURES": np.array([[0.0, 0.1]], np.float32)},
        {"FEATURES": np.array([[1.9, 1.9], [0.2, -0.3], [-1.5, -1.5]], np.float32)},
    ]
    out = backend.execute(requests)
    assert out[0]["PROBABILITIES"].shape == (1, 2) and out[1]["PROBABILITIES"].shape == (3, 2)
    assert out[0]["PROBABILITIES"].argmax(1).tolist() == [1]
    assert out[1]["PROBABILITIES"].argmax(1).tolist() == [0, 1, 0]
    np.testing.assert_allclose(out[1]["PROBABILITIES"].sum(1), 1.0, rtol=1e-5)
    alone = backend.execute([requests[1]])[0]["PROBABILITIES"]
    np.testing.assert_allclose(alone, out[1]["PROBABILITIES"], rtol=1e-6)
    backend.unload()


def test_inputs_and_outputs_are_described_for_auto_complete() -> None:
    backend = create_backend("onnxruntime")
    backend.load(spec(inputs=[], outputs=[]))
    facts = backend.describe()
    assert facts["inputs"] == [TensorSpec("FEATURES", "FP32", [2])]
    assert facts["outputs"] == [TensorSpec("PROBABILITIES", "FP32", [2])]
    # without a batch dimension the leading (dynamic) dimension stays, as -1
    flat = create_backend("onnxruntime")
    flat.load(spec(max_batch_size=0, inputs=[], outputs=[]))
    assert flat.describe()["inputs"] == [TensorSpec("FEATURES", "FP32", [-1, 2])]


def test_bad_model_file(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.onnx").write_bytes(b"not onnx at all")
    with pytest.raises(ValueError, match="not a valid ONNX model"):
        create_backend("onnxruntime").load(spec(model_dir=str(tmp_path), version_dir=str(tmp_path / "1")))
