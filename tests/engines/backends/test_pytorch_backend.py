"""The pytorch backend: TorchScript (`model.pt`) and torch.export (`model.pt2`) files, batched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engines.backends import create_backend
from engines.types import TensorModelSpec, TensorSpec


class TwoOutputs(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, (a * b).sum(dim=1, keepdim=True)


def spec(folder: Path, filename: str = "") -> TensorModelSpec:
    return TensorModelSpec(
        name="two",
        version=1,
        model_dir=str(folder),
        version_dir=str(folder / "1"),
        max_batch_size=8,
        inputs=[TensorSpec("INPUT__0", "FP32", [3]), TensorSpec("INPUT__1", "FP32", [3])],
        outputs=[TensorSpec("OUTPUT__0", "FP32", [3]), TensorSpec("OUTPUT__1", "FP32", [1])],
        default_model_filename=filename or None,
    )


def requests() -> list[dict[str, np.ndarray]]:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    return [{"INPUT__0": a, "INPUT__1": np.ones_like(a)}, {"INPUT__0": a[:1] * 2, "INPUT__1": a[:1]}]


def check(out: list[dict[str, np.ndarray]]) -> None:
    assert out[0]["OUTPUT__0"].tolist() == [[1, 2, 3], [4, 5, 6]]
    assert out[0]["OUTPUT__1"].tolist() == [[3], [12]]
    assert out[1]["OUTPUT__0"].tolist() == [[0, 3, 6]] and out[1]["OUTPUT__1"].tolist() == [[10]]


def test_torchscript_file(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    torch.jit.save(torch.jit.script(TwoOutputs()), str(tmp_path / "1" / "model.pt"))
    backend = create_backend("pytorch")
    backend.load(spec(tmp_path))
    check(backend.execute(requests()))


def test_torch_export_file(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(
        TwoOutputs(), (torch.ones(2, 3), torch.ones(2, 3)), dynamic_shapes=({0: batch}, {0: batch})
    )
    torch.export.save(program, str(tmp_path / "1" / "model.pt2"))
    backend = create_backend("pytorch")
    backend.load(spec(tmp_path, "model.pt2"))
    check(backend.execute(requests()))


def test_output_count_mismatch_and_bytes(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()

    class One(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a

    torch.jit.save(torch.jit.script(One()), str(tmp_path / "1" / "model.pt"))
    backend = create_backend("pytorch")
    backend.load(spec(tmp_path))
    with pytest.raises(RuntimeError, match="returned 1 tensors for 2"):
        backend.execute(requests())
    text = spec(tmp_path)
    text.inputs[0] = TensorSpec("INPUT__0", "BYTES", [1])
    with pytest.raises(ValueError, match="BYTES"):
        create_backend("pytorch").load(text)
