"""Tensors as the gateway hands them between frontends, schedulers and backends: numpy arrays named by KServe v2's
datatypes. They sit below every frontend: `kserve/codec.py` puts them on the wire, `openai/embeddings.py` builds
them for an embedding model, the tensor schedulers batch them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Fixed-size wire datatypes -> numpy dtype (little-endian on the wire).
FIXED_DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    **{f"{sign}INT{bits}": np.dtype(f"{sign.lower()}int{bits}") for sign in ("U", "") for bits in (8, 16, 32, 64)},
    **{f"FP{bits}": np.dtype(f"float{bits}") for bits in (16, 32, 64)},
}
#: Wire datatype -> numpy dtype of the decoded array.
DATATYPES: Mapping[str, np.dtype] = {**FIXED_DATATYPES, "BF16": np.dtype(np.float32), "BYTES": np.dtype(object)}


@dataclass
class InputTensor:
    """A decoded request input."""
    name: str
    datatype: str
    array: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class OutputTensor:
    """A model output to encode; ``datatype`` defaults to the array's (set it for BF16)."""
    name: str
    array: np.ndarray
    datatype: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
