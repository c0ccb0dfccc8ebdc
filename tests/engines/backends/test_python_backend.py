"""The python backend: model.py discovery, initialize arguments, the dict API, errors and finalize."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engines.backends import create_backend
from engines.backends.python_backend import PythonBackend
from engines.types import TensorModelSpec, TensorSpec


def spec(folder: Path, **kw) -> TensorModelSpec:
    values = dict(
        name=folder.name,
        version=1,
        model_dir=str(folder),
        version_dir=str(folder / "1"),
        max_batch_size=4,
        inputs=[TensorSpec("IN", "FP32", [2])],
        outputs=[TensorSpec("OUT", "FP32", [2])],
        parameters={"scale": "3"},
        config={"name": folder.name, "backend": "python"},
    )
    values.update(kw)
    return TensorModelSpec(**values)


def write_model(folder: Path, source: str, filename: str = "model.py") -> Path:
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / filename).write_text(source)
    return folder


SCALER = """
import json
import numpy as np

RECORD = {}

class TritonPythonModel:
    def initialize(self, args):
        RECORD["args"] = args
        self.scale = float(args["parameters"]["scale"])

    def execute(self, requests):
        return [{"OUT": r["IN"] * self.scale} for r in requests]

    def finalize(self):
        RECORD["finalized"] = True
"""


def test_initialize_execute_finalize(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "scaler", SCALER)
    backend = create_backend("python")
    backend.load(spec(folder, instance_index=1))
    module = backend._model.__class__.__module__
    import sys

    record = sys.modules[module].RECORD
    args = record["args"]
    assert args["model_name"] == "scaler" and args["model_version"] == "1" and args["model_repository"] == str(folder)
    assert json.loads(args["model_config"]) == {"name": "scaler", "backend": "python"}
    assert args["model_instance_name"] == "scaler_1" and args["model_instance_kind"] == "CPU"
    out = backend.execute([{"IN": np.ones((1, 2), np.float32)}, {"IN": np.full((2, 2), 2, np.float32)}])
    assert out[0]["OUT"].tolist() == [[3, 3]] and out[1]["OUT"].tolist() == [[6, 6], [6, 6]]
    backend.unload()
    assert record["finalized"] and module not in sys.modules


def test_each_instance_gets_its_own_module(tmp_path: Path) -> None:
    folder = write_model(
        tmp_path / "counter",
        "class TritonPythonModel:\n    n = 0\n    def execute(self, requests):\n"
        "        type(self).n += 1\n        return [{'OUT': r['IN'] * type(self).n} for r in requests]\n",
    )
    a, b = PythonBackend(), PythonBackend()
    a.load(spec(folder))
    b.load(spec(folder))
    x = {"IN": np.ones((1, 2), np.float32)}
    a.execute([x])
    assert a.execute([x])[0]["OUT"].tolist() == [[2, 2]]
    assert b.execute([x])[0]["OUT"].tolist() == [[1, 1]]  # class state is not shared between instances


def test_default_model_filename(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "named", SCALER, "custom.py")
    backend = PythonBackend()
    backend.load(spec(folder, default_model_filename="custom.py"))
    assert backend.execute([{"IN": np.ones((1, 2), np.float32)}])[0]["OUT"].tolist() == [[3, 3]]
    with pytest.raises(ValueError, match="inside the version folder"):
        PythonBackend().load(spec(folder, default_model_filename="../../escape.py"))


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("import triton_python_backend_utils as pb_utils\nclass TritonPythonModel: pass\n", "pb_utils"),
        ("import not_a_real_module_xyz\n", "not_a_real_module_xyz"),
        ("class Something:\n    pass\n", "TritonPythonModel"),
    ],
)
def test_load_errors_say_what_to_fix(tmp_path: Path, source: str, fragment: str) -> None:
    folder = write_model(tmp_path / "bad", source)
    with pytest.raises(ValueError, match=fragment):
        PythonBackend().load(spec(folder))


def test_missing_model_file(tmp_path: Path) -> None:
    (tmp_path / "empty" / "1").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"model\.py' is missing"):
        PythonBackend().load(spec(tmp_path / "empty"))


def test_wrong_number_of_responses_is_an_error(tmp_path: Path) -> None:
    folder = write_model(
        tmp_path / "short", "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
    )
    backend = PythonBackend()
    backend.load(spec(folder))
    with pytest.raises(RuntimeError, match="0 responses for 1 requests"):
        backend.execute([{"IN": np.ones((1, 2), np.float32)}])
