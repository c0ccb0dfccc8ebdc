"""Batch helpers for backends that run one model call per batch (onnxruntime, pytorch): requests are
concatenated along the batch dimension, run once, and the outputs split back by each request's batch size."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engines.types import TensorModelSpec


def concat_requests(
    spec: TensorModelSpec, requests: Sequence[dict[str, np.ndarray]]
) -> tuple[dict[str, np.ndarray], list[int]]:
    """One input dict for the whole batch, plus each request's batch size (1 each when the model has no batch dim)."""
    if spec.max_batch_size == 0:
        if len(requests) != 1:
            raise ValueError("a model without a batch dimension runs one request at a time")
        return dict(requests[0]), [1]
    sizes = [next(iter(r.values())).shape[0] if r else 1 for r in requests]
    if len(requests) == 1:
        return dict(requests[0]), sizes
    names = list(requests[0])  # the batcher only batches requests with the same inputs (names, dtypes, shapes)
    batch = {name: np.concatenate([r[name] for r in requests], axis=0) for name in names}
    return batch, sizes


def split_outputs(
    spec: TensorModelSpec, outputs: dict[str, np.ndarray], sizes: list[int]
) -> list[dict[str, np.ndarray]]:
    """Undo `concat_requests` on the model's outputs."""
    if len(sizes) == 1:
        return [outputs]
    bounds = np.cumsum(sizes)[:-1]
    parts = {name: np.split(array, bounds, axis=0) for name, array in outputs.items()}
    return [{name: parts[name][i] for name in outputs} for i in range(len(sizes))]


def model_file(spec: TensorModelSpec, default: str) -> str:
    """The model file inside the version folder (`default_model_filename` or the backend's default name)."""
    from pathlib import Path

    name = spec.default_model_filename or default
    version_dir = Path(spec.version_dir).resolve()
    path = (version_dir / name).resolve()
    if version_dir not in path.parents:
        raise ValueError(f"default_model_filename {name!r} must name a file inside the version folder")
    if not path.is_file():
        raise ValueError(f"model file '{spec.name}/{spec.version}/{name}' is missing; put the model file there")
    return str(path)
