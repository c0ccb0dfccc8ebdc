"""Tensors as the gateway hands them between frontends, schedulers and backends: numpy arrays named by KServe v2's
datatypes, and their raw byte layout (row-major, little-endian; BYTES as length-prefixed elements). They sit below
every frontend: `kserve/codec.py` puts them on the wire (the raw layout is the binary tensor extension's and gRPC's
raw contents), the tensor runtime reads warmup files in the same layout, the tensor schedulers batch them."""

from __future__ import annotations

import math
import struct
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


class TensorCodecError(ValueError):
    """A tensor or infer request that cannot be decoded; the message is client-safe."""


_WIRE_SIZE: dict[str, int] = {**{k: v.itemsize for k, v in FIXED_DATATYPES.items()}, "BF16": 2}
_BY_DTYPE: dict[np.dtype, str] = {v: k for k, v in FIXED_DATATYPES.items()}
_U32 = struct.Struct("<I")
_MAX_DIM = 2**63 - 1


def short_repr(value: Any, limit: int = 40) -> str:
    """repr() clipped, so an error never echoes a megabyte back to the client."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def numpy_dtype(datatype: Any) -> np.dtype:
    """The numpy dtype used for a wire datatype (BYTES -> object, BF16 -> float32)."""
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise TensorCodecError(f"unknown datatype {short_repr(datatype)}")
    return DATATYPES[datatype]


def datatype_of(array: np.ndarray) -> str:
    """The wire datatype for a numpy array (str/bytes/object arrays are BYTES)."""
    dtype = np.asarray(array).dtype
    if dtype.kind in "OSU":
        return "BYTES"
    name = _BY_DTYPE.get(dtype.newbyteorder("="))
    if name is None:
        raise TensorCodecError(f"numpy dtype {dtype} has no KServe v2 datatype")
    return name


def parse_shape(shape: Any, label: str = "tensor") -> tuple[int, ...]:
    """Validate a wire shape: a list of non-negative integers."""
    if not isinstance(shape, (list, tuple)):
        raise TensorCodecError(f"{label}: shape must be a list of integers")
    for dim in shape:
        if type(dim) is not int or dim < 0 or dim > _MAX_DIM:
            raise TensorCodecError(f"{label}: shape dimensions must be non-negative integers, got {short_repr(dim)}")
    return tuple(shape)


def reshape_checked(flat: np.ndarray, shape: tuple[int, ...], label: str) -> np.ndarray:
    try:
        return flat.reshape(shape)
    except ValueError:
        raise TensorCodecError(f"{label}: shape {short_repr(list(shape))} is too large") from None


def count_error(label: str, shape: tuple[int, ...], datatype: str, got: str) -> TensorCodecError:
    want = math.prod(shape)
    return TensorCodecError(f"{label}: shape {short_repr(list(shape))} needs {want} {datatype} element(s), got {got}")


def _split_bytes(view: memoryview, count: int, label: str) -> np.ndarray:
    """BYTES elements from 4-byte little-endian length prefixes, each checked against what is left."""
    total = len(view)
    if count * 4 > total:
        raise TensorCodecError(f"{label}: {total} bytes cannot hold {count} BYTES element(s)")
    out = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        if total - offset < 4:
            raise TensorCodecError(f"{label}: BYTES data ends before element {i}")
        (length,) = _U32.unpack_from(view, offset)
        offset += 4
        if length > total - offset:
            raise TensorCodecError(f"{label}: BYTES element {i} claims {length} bytes but only {total - offset} remain")
        out[i] = bytes(view[offset : offset + length])
        offset += length
    if offset != total:
        raise TensorCodecError(f"{label}: {total - offset} unexpected byte(s) after the BYTES elements")
    return out


def decode_binary_tensor(
    datatype: Any, shape: Any, blob: bytes | bytearray | memoryview, label: str = "tensor"
) -> np.ndarray:
    """Decode one raw tensor (binary extension blob or gRPC raw content) into an array."""
    numpy_dtype(datatype)
    shape = parse_shape(shape, label)
    view = memoryview(blob).cast("B")
    count = math.prod(shape)
    if datatype == "BYTES":
        return reshape_checked(_split_bytes(view, count, label), shape, label)
    size = count * _WIRE_SIZE[datatype]
    if len(view) != size:
        raise count_error(label, shape, datatype, f"{len(view)} bytes instead of {size}")
    if datatype == "BOOL":
        flat = np.frombuffer(view, dtype=np.uint8) != 0
    elif datatype == "BF16":
        flat = (np.frombuffer(view, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        dtype = FIXED_DATATYPES[datatype]
        flat = np.frombuffer(view, dtype=dtype.newbyteorder("<")).astype(dtype)
    return reshape_checked(flat, shape, label)


def as_bytes(item: Any) -> bytes:
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    return str(item).encode("utf-8")


def _to_bf16_bits(array: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounding to nearest-even and keeping NaN a NaN."""
    f32 = np.ascontiguousarray(array, dtype=np.float32)
    bits = f32.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded[np.isnan(f32)] = 0x7FC0
    return rounded.astype("<u2")


def encode_binary_tensor(array: np.ndarray, datatype: str | None = None) -> bytes:
    """Raw little-endian, row-major bytes for a tensor (BYTES: length-prefixed elements)."""
    array = np.asarray(array)
    datatype = datatype or datatype_of(array)
    numpy_dtype(datatype)
    if datatype == "BYTES":
        parts: list[bytes] = []
        for item in array.ravel():
            data = as_bytes(item)
            if len(data) > 0xFFFFFFFF:
                raise TensorCodecError("BYTES element longer than 4 GiB")
            parts.append(_U32.pack(len(data)))
            parts.append(data)
        return b"".join(parts)
    if datatype == "BF16":
        return _to_bf16_bits(array).tobytes()
    return np.ascontiguousarray(array, dtype=FIXED_DATATYPES[datatype].newbyteorder("<")).tobytes()
