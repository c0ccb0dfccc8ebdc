"""A tiny python-backend tensor model for model-control tests: cheap to load, its answers say which copy served.

`write_tagger(repo, name, tag=..., code_version=..., delay=...)`: X (FP32 [1]) -> Y = 2 * X and
TAG = "<code_version>:<tag>" (BYTES [1]); `delay` seconds of sleep per batch (of at most `max_batch_size`) make requests
queue and stay in flight during a reload. `tag` lives in the config, `code_version` in model.py, so tests can change
either.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

MODEL_PY = """
import time

import numpy as np

VERSION = "{code_version}"


class TritonPythonModel:
    def initialize(self, args):
        self.tag = args["parameters"].get("tag", "")
        self.delay = float(args["parameters"].get("delay", "0"))

    def execute(self, requests):
        if self.delay:
            time.sleep(self.delay)
        label = (VERSION + ":" + self.tag).encode()
        return [{{"Y": r["X"] * 2, "TAG": np.array([[label]] * len(r["X"]), dtype=object)}} for r in requests]
"""

CONFIG_YAML = """backend: python
max_batch_size: {max_batch_size}
input:
  - {{name: X, data_type: FP32, dims: [1]}}
output:
  - {{name: Y, data_type: FP32, dims: [1]}}
  - {{name: TAG, data_type: BYTES, dims: [1]}}
dynamic_batching: {{max_queue_delay_microseconds: 1000}}
parameters:
  tag: "{tag}"
  delay: "{delay}"
"""


def atomic_write(path: Path, text: str) -> None:
    """Write through a temporary file and a rename, as a careful deployment would (no half-written file is seen)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_tagger(
    repo: Path,
    name: str = "tagger",
    *,
    tag: str = "a",
    code_version: str = "v1",
    delay: float = 0.0,
    config: bool = True,
    max_batch_size: int = 8,
) -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    atomic_write(folder / "1" / "model.py", MODEL_PY.format(code_version=code_version))
    if config:
        set_tag(folder, tag, delay, max_batch_size)
    return folder


def set_tag(folder: Path, tag: str, delay: float = 0.0, max_batch_size: int = 8) -> None:
    atomic_write(folder / "config.yaml", CONFIG_YAML.format(tag=tag, delay=delay, max_batch_size=max_batch_size))


def tagger_request(x: float = 1.0) -> dict:
    """A v2 JSON infer body for the tagger."""
    return {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [x]}]}


def x_input(x: float = 1.0):
    from gateway.tensor.tensors import InputTensor

    return InputTensor("X", "FP32", np.array([[x]], dtype=np.float32))
