"""The tensorflow backend: a SavedModel's serving signature as v2 tensors (config auto-completed or checked),
outputs equal to the model's own call within float tolerance, batched on the first dimension."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.tensorflow
tf = pytest.importorskip("tensorflow")

from gateway.errors import ConfigError  # noqa: E402
from gateway.repository.layout import find_model_dir  # noqa: E402
from gateway.repository.model_config import parse_model_config  # noqa: E402
from gateway.tensor.model import TensorModel  # noqa: E402
from tests.engines.backends import tensorflow_models  # noqa: E402

ROWS = np.random.default_rng(0).normal(size=(12, 4)).astype(np.float32)
TAGS = np.array([[f"row{i}".encode()] for i in range(12)], dtype=object)


def load(repo: Path, name: str) -> TensorModel:
    model_dir = find_model_dir(repo, name)
    assert model_dir is not None
    model = TensorModel(model_dir, parse_model_config(model_dir.config_path, name))  # type: ignore[arg-type]
    model.load()
    return model


def test_signature_fills_in_the_config(tmp_path: Path) -> None:
    tensorflow_models.write(tmp_path)
    meta = load(tmp_path, "tf_scorer").metadata()
    assert meta["platform"] == "tensorflow_savedmodel"
    assert {t["name"]: (t["datatype"], t["shape"]) for t in meta["inputs"]} == {
        "FEATURES": ("FP32", [-1, 4]),
        "TAG": ("BYTES", [-1, 1]),
    }
    assert {t["name"]: (t["datatype"], t["shape"]) for t in meta["outputs"]} == {
        "SCORES": ("FP32", [-1, 3]),
        "ECHO": ("BYTES", [-1, 1]),
    }


def test_outputs_match_the_model_batched_through_the_dynamic_batcher(tmp_path: Path) -> None:
    module = tensorflow_models.write(tmp_path)
    expected = module.serve(FEATURES=tf.constant(ROWS), TAG=tf.constant(TAGS))
    model = load(tmp_path, "tf_scorer")

    async def main() -> list:
        await model.start()
        try:
            batcher = model.versions[1].batcher
            return await asyncio.gather(
                *(batcher.infer({"FEATURES": ROWS[i : i + 1], "TAG": TAGS[i : i + 1]}) for i in range(len(ROWS)))
            )
        finally:
            await model.stop()

    results = asyncio.run(main())
    scores = np.vstack([r["SCORES"] for r in results])
    np.testing.assert_allclose(scores, expected["SCORES"].numpy(), rtol=1e-5, atol=1e-6)
    assert [r["ECHO"][0, 0] for r in results] == [f"ROW{i}".encode() for i in range(12)]
    assert model.versions[1].stats.execution_count < len(ROWS)  # requests shared signature calls


def test_declared_tensors_are_checked_against_the_signature(tmp_path: Path) -> None:
    base = 'platform: "tensorflow_savedmodel" max_batch_size: 4 '
    fp64 = 'input [ { name: "FEATURES" data_type: TYPE_FP64 dims: [ 4 ] } ]'
    tensorflow_models.write(tmp_path, "wrong_type", base + fp64)
    with pytest.raises(ConfigError, match="FP64 in the config but FP32"):
        load(tmp_path, "wrong_type")
    probs = 'output [ { name: "PROBS" data_type: TYPE_FP32 dims: [ 3 ] } ]'
    tensorflow_models.write(tmp_path, "wrong_name", base + probs)
    with pytest.raises(ConfigError, match="not in signature"):
        load(tmp_path, "wrong_name")
    signature = 'parameters { key: "TF_SIGNATURE_DEF" value: { string_value: "x" } }'
    tensorflow_models.write(tmp_path, "no_sig", base + signature)
    with pytest.raises(ConfigError, match="serving_default"):
        load(tmp_path, "no_sig")


def test_max_batch_size_is_completed_when_omitted(tmp_path: Path) -> None:
    tensorflow_models.write(tmp_path, "auto", 'platform: "tensorflow_savedmodel"\n')
    model = load(tmp_path, "auto")
    config = model.config_json()
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config  # Triton's default-max-batch-size
    assert {t["name"]: t["shape"] for t in model.metadata()["inputs"]} == {"FEATURES": [-1, 4], "TAG": [-1, 1]}
    tensorflow_models.write(tmp_path, "unbatched", 'platform: "tensorflow_savedmodel"\nmax_batch_size: 0\n')
    plain = load(tmp_path, "unbatched")
    assert plain.config_json()["max_batch_size"] == 0
    assert plain.config_json()["input"][0]["dims"] in ([-1, 4], [-1, 1])  # the batch dim is a plain -1 dim


def test_the_example_folder_serves_as_written(tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    from tests.conftest import ROOT

    folder = tmp_path / "tensorflow_scorer"
    shutil.copytree(ROOT / "examples" / "tensorflow_scorer", folder, ignore=shutil.ignore_patterns("1"))
    done = subprocess.run(
        [sys.executable, str(folder / "make_model.py"), str(folder)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    model = load(tmp_path, "tensorflow_scorer")
    assert model.config_json()["max_batch_size"] == 4
    assert {t["name"] for t in model.metadata()["outputs"]} == {"SCORES", "ECHO"}
