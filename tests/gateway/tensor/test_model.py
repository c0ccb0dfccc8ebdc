"""Loading a tensor model from its folder: version selection, warmup, auto-complete, instances, and request checks."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from gateway.errors import ConfigError, InvalidRequestError, NotFoundError
from gateway.repository.layout import find_model_dir
from gateway.repository.model_config import parse_model_config
from gateway.tensor.model import TensorModel
from gateway.tensor.tensors import InputTensor, encode_binary_tensor

ROOT = Path(__file__).resolve().parents[3]

RECORDER = """
import numpy as np

CALLS = []


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])

    def execute(self, requests):
        CALLS.extend({k: v.copy() for k, v in r.items()} for r in requests)
        return [{"OUT": r["IN"].astype(np.float32) * self.version} for r in requests]
"""


def make_model(root: Path, config: str, versions: tuple[int, ...] = (1,), name: str = "rec") -> TensorModel:
    folder = root / name
    for v in versions:
        (folder / str(v)).mkdir(parents=True, exist_ok=True)
        (folder / str(v) / "model.py").write_text(RECORDER)
    (folder / "config.pbtxt").write_text(config)
    model_dir = find_model_dir(root, name)
    assert model_dir is not None
    return TensorModel(model_dir, parse_model_config(model_dir.config_path, name))  # type: ignore[arg-type]


BASE = (
    'backend: "python" max_batch_size: 4 input { name: "IN" data_type: TYPE_INT32 dims: [ 2 ] } '
    'output { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] }'
)


def calls(model: TensorModel, version: int) -> list:
    instance = model.versions[version].instances[0]
    import sys

    return sys.modules[instance._module_name].CALLS  # type: ignore[attr-defined]


def test_version_policy_picks_folders(tmp_path: Path) -> None:
    model = make_model(tmp_path, BASE + " version_policy { specific { versions: [ 1, 3 ] } }", versions=(1, 2, 3))
    model.load()
    assert sorted(model.versions) == [1, 3]
    assert model.version().version == 3 and model.version("1").version == 1
    with pytest.raises(NotFoundError):
        model.version("2")
    assert model.metadata()["versions"] == ["1", "3"]
    latest = make_model(tmp_path, BASE, versions=(1, 2, 3), name="latest")
    latest.load()
    assert sorted(latest.versions) == [3]
    nothing = make_model(tmp_path, BASE + " version_policy { specific { versions: [ 9 ] } }", name="nothing")
    with pytest.raises(ConfigError, match="no version folder matches"):
        nothing.load()


def test_warmup_runs_on_every_instance(tmp_path: Path) -> None:
    warm = tmp_path / "rec" / "warmup"
    warm.mkdir(parents=True)
    (warm / "ones.bin").write_bytes(encode_binary_tensor(np.ones((2, 2), dtype=np.int32)))
    config = (
        BASE
        + """ instance_group { count: 2 }
        model_warmup [
          { name: "zeros" batch_size: 3 count: 2 inputs { key: "IN" value: { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true } } },
          { name: "file" batch_size: 2 inputs { key: "IN" value: { data_type: TYPE_INT32 dims: [ 2 ] input_data_file: "ones.bin" } } }
        ]"""
    )
    model = make_model(tmp_path, config)
    model.load()
    seen = calls(model, 1)
    assert len(model.versions[1].instances) == 2
    # every instance has its own module; this one saw 2 zero batches of 3 rows and one file batch of 2 rows
    assert [c["IN"].shape for c in seen] == [(3, 2), (3, 2), (2, 2)]
    assert seen[0]["IN"].sum() == 0 and seen[2]["IN"].tolist() == [[1, 1], [1, 1]]


def test_warmup_failure_and_escaping_warmup_file_fail_the_load(tmp_path: Path) -> None:
    bad = make_model(
        tmp_path,
        BASE + ' model_warmup { name: "w" batch_size: 1 inputs { key: "IN" value: '
        '{ data_type: TYPE_INT32 dims: [ 2 ] input_data_file: "../../etc/passwd" } } }',
    )
    with pytest.raises(ConfigError, match="must exist inside"):
        bad.load()
    raising = tmp_path / "raising"
    (raising / "1").mkdir(parents=True)
    (raising / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def execute(self, requests):\n        raise RuntimeError('broken')\n"
    )
    (raising / "config.pbtxt").write_text(
        BASE + ' model_warmup { name: "w" inputs { key: "IN" value: '
        "{ data_type: TYPE_INT32 dims: [ 2 ] random_data: true } } }"
    )
    model_dir = find_model_dir(tmp_path, "raising")
    assert model_dir is not None
    with pytest.raises(ConfigError, match="model_warmup 'w' failed"):
        TensorModel(model_dir, parse_model_config(model_dir.config_path, "raising")).load()  # type: ignore[arg-type]


async def test_inference_checks_and_reshape(tmp_path: Path) -> None:
    model = make_model(
        tmp_path,
        'backend: "python" max_batch_size: 4 '
        'input { name: "IN" data_type: TYPE_INT32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } '
        'output { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } '
        "dynamic_batching { }",
    )
    model.load()
    await model.start()
    try:
        data = InputTensor("IN", "INT32", np.arange(8, dtype=np.int32).reshape(2, 4))
        _, outputs = await model.infer([data])
        assert calls(model, 1)[-1]["IN"].shape == (2, 2, 2)  # the backend sees the reshaped tensor
        assert outputs[0].array.shape == (2, 4) and outputs[0].array.dtype == np.float32  # the client sees dims
        assert outputs[0].array.ravel().tolist() == list(range(8))
        with pytest.raises(InvalidRequestError, match="batch size 5"):
            await model.infer([InputTensor("IN", "INT32", np.zeros((5, 4), np.int32))])
        with pytest.raises(InvalidRequestError, match="needs input"):
            await model.infer([])
        with pytest.raises(InvalidRequestError, match="no output"):
            await model.infer([data], wanted=["NOPE"])
    finally:
        await model.stop()


def test_onnx_config_is_completed_from_the_model(tmp_path: Path) -> None:
    folder = tmp_path / "auto"
    shutil.copytree(ROOT / "model_repository" / "circle_classifier" / "1", folder / "1")
    (folder / "config.pbtxt").write_text('platform: "onnxruntime_onnx" max_batch_size: 8')
    model_dir = find_model_dir(tmp_path, "auto")
    assert model_dir is not None
    model = TensorModel(model_dir, parse_model_config(model_dir.config_path, "auto"))  # type: ignore[arg-type]
    model.load()
    meta = model.metadata()
    assert meta["inputs"] == [{"name": "FEATURES", "datatype": "FP32", "shape": [-1, 2]}]
    assert model.config_json()["output"][0]["data_type"] == "TYPE_FP32"


def test_missing_backend_files_name_the_version(tmp_path: Path) -> None:
    folder = tmp_path / "empty"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(BASE)
    model_dir = find_model_dir(tmp_path, "empty")
    assert model_dir is not None
    with pytest.raises(ConfigError, match=r"version 1: .*model.py' is missing"):
        TensorModel(model_dir, parse_model_config(model_dir.config_path, "empty")).load()  # type: ignore[arg-type]


def test_failed_load_unloads_what_was_loaded(tmp_path: Path) -> None:
    marker = tmp_path / "finalized"
    folder = tmp_path / "half"
    for version in (1, 2):
        (folder / str(version)).mkdir(parents=True)
    (folder / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
        f"    def finalize(self):\n        open({str(marker)!r}, 'a').write('x')\n"
    )
    (folder / "2" / "model.py").write_text(
        "class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('cannot start')\n"
        "    def execute(self, requests):\n        return []\n"
    )
    (folder / "config.pbtxt").write_text(BASE + " version_policy { all { } } instance_group { count: 2 }")
    model_dir = find_model_dir(tmp_path, "half")
    assert model_dir is not None
    model = TensorModel(model_dir, parse_model_config(model_dir.config_path, "half"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"failed to load \(RuntimeError: cannot start\)"):
        model.load()
    assert marker.read_text() == "xx"  # both instances of version 1 were finalized
    assert model.versions == {}
