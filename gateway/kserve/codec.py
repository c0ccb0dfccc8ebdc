"""KServe v2 tensors between the wire and numpy.

One module decides what a v2 tensor looks like on the wire, so the HTTP and gRPC front
ends cannot drift apart: JSON ``data`` lists, the binary tensor extension (a JSON header
followed by raw blobs, its length in ``Inference-Header-Content-Length``) and gRPC's
``raw_input_contents`` / ``raw_output_contents`` all go through here.

Everything a client can get wrong raises :class:`TensorCodecError`, whose message is safe
to return in a 400. Sizes a client claims are checked against the bytes actually received
before anything is allocated from them.

Arrays: fixed-size datatypes map to the numpy dtype of the same name (little-endian on the
wire); BYTES is an object array of ``bytes``; BF16, which numpy lacks,
is carried as float32 (rounded to nearest-even when written as binary). gRPC's typed
``contents`` can be decoded with :func:`decode_json_tensor` (BYTES elements may be ``bytes``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from gateway.http.body_depth import has_lone_surrogate
from gateway.tensor.tensors import (
    DATATYPES,
    InputTensor,
    OutputTensor,
    TensorCodecError,
    as_bytes,
    count_error,
    datatype_of,
    decode_binary_tensor,
    encode_binary_tensor,
    numpy_dtype,
    parse_shape,
    reshape_checked,
    short_repr,
)

HEADER_LENGTH_HEADER = "Inference-Header-Content-Length"
_MAX_NESTING = 64


# ---------------------------------------------------------------- JSON tensors


def _flatten(data: Any, label: str) -> list[Any]:
    """Row-major flattening of nested lists, iterative so deep nesting cannot recurse."""
    if not isinstance(data, list):
        raise TensorCodecError(f"{label}: data must be a list")
    if not any(isinstance(item, list) for item in data):
        return data
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) >= _MAX_NESTING:
                    raise TensorCodecError(f"{label}: data is nested too deeply")
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _values_to_array(flat: list[Any], datatype: str, label: str) -> np.ndarray:
    """Typed 1-D array from JSON scalars, rejecting values the datatype cannot hold."""
    types = set(map(type, flat))
    dtype = DATATYPES[datatype]
    if datatype == "BYTES":
        if not types <= {str, bytes}:
            raise TensorCodecError(f"{label}: BYTES data must be strings")
        out = np.empty(len(flat), dtype=object)
        try:
            out[:] = [v.encode("utf-8") if isinstance(v, str) else v for v in flat]
        except UnicodeEncodeError:
            raise TensorCodecError(f"{label}: BYTES data is not valid UTF-8") from None
        return out
    if datatype == "BOOL":
        if not types <= {bool}:
            raise TensorCodecError(f"{label}: BOOL data must be true/false")
        return np.array(flat, dtype=np.bool_)
    if dtype.kind in "iu":
        if not types <= {int}:
            raise TensorCodecError(f"{label}: {datatype} data must be integers")
        info = np.iinfo(dtype)
        if flat and (min(flat) < info.min or max(flat) > info.max):
            raise TensorCodecError(f"{label}: value out of range for {datatype}")
        return np.array(flat, dtype=dtype)
    if not types <= {int, float}:
        raise TensorCodecError(f"{label}: {datatype} data must be numbers")
    try:
        wide = np.array(flat, dtype=np.float64)
    except OverflowError:
        raise TensorCodecError(f"{label}: value out of range for {datatype}") from None
    if dtype != np.float64 and wide.size:
        finite = wide[np.isfinite(wide)]
        if finite.size and np.abs(finite).max() > np.finfo(dtype).max:
            raise TensorCodecError(f"{label}: value out of range for {datatype}")
    return wide.astype(dtype)


def _tensor_header(doc: Any, where: str) -> tuple[str, str, tuple[int, ...], dict[str, Any]]:
    """Common checks on an input's name, datatype, shape and parameters."""
    if not isinstance(doc, Mapping):
        raise TensorCodecError(f"{where} must be a JSON object")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise TensorCodecError(f"{where} needs a non-empty string 'name'")
    datatype = doc.get("datatype")
    numpy_dtype(datatype)
    if "shape" not in doc:
        raise TensorCodecError(f"input {short_repr(name)} has no 'shape'")
    shape = parse_shape(doc["shape"], f"input {short_repr(name)}")
    params = doc.get("parameters")
    if params is None:
        params = {}
    elif not isinstance(params, Mapping):
        raise TensorCodecError(f"input {short_repr(name)}: parameters must be a JSON object")
    return name, datatype, shape, dict(params)


def decode_json_tensor(doc: Any) -> InputTensor:
    """Decode a JSON tensor ``{"name","datatype","shape","data","parameters"?}`` into an :class:`InputTensor`."""
    name, datatype, shape, params = _tensor_header(doc, "input")
    if "data" not in doc:
        raise TensorCodecError(f"input {short_repr(name)} has no 'data'")
    label = f"input {short_repr(name)}"
    flat = _flatten(doc["data"], label)
    if len(flat) != math.prod(shape):
        raise count_error(label, shape, datatype, str(len(flat)))
    array = reshape_checked(_values_to_array(flat, datatype, label), shape, label)
    return InputTensor(name, datatype, array, params)


def encode_json_tensor(
    name: str, array: np.ndarray, datatype: str | None = None, parameters: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A JSON output entry with flat row-major ``data`` (BYTES must be UTF-8 to fit JSON)."""
    array = np.asarray(array)
    datatype = datatype or datatype_of(array)
    dtype = numpy_dtype(datatype)
    if datatype == "BYTES":
        try:
            data: list[Any] = [as_bytes(v).decode("utf-8") for v in array.ravel()]
        except UnicodeDecodeError:
            raise TensorCodecError(f"output {short_repr(name)} is not UTF-8; request it with binary_data") from None
    else:
        data = array.astype(dtype, copy=False).ravel().tolist()
    entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
    if parameters:
        entry["parameters"] = dict(parameters)
    entry["data"] = data
    return entry


# ---------------------------------------------------------------- HTTP infer requests / responses


@dataclass
class RequestedOutput:
    """An entry of the request's ``outputs``; ``binary`` already folds in ``binary_data_output``."""

    name: str
    binary: bool
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferRequest:
    """A decoded v2 infer request; ``outputs`` empty means "all outputs"."""

    inputs: list[InputTensor]
    outputs: list[RequestedOutput] = field(default_factory=list)
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    binary_data_output: bool = False

    def wants_binary(self, output_name: str) -> bool:
        """Whether this output goes in the binary section of the response."""
        for out in self.outputs:
            if out.name == output_name:
                return out.binary
        return self.binary_data_output


def parse_header_length(value: Any, body_length: int) -> int | None:
    """Validate ``Inference-Header-Content-Length`` (None when the header is absent)."""
    if value is None:
        return None
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]{1,19}\s*", value):
        value = int(value)
    if type(value) is not int or value < 0:
        raise TensorCodecError(f"{HEADER_LENGTH_HEADER} must be a non-negative integer")
    if value > body_length:
        raise TensorCodecError(f"{HEADER_LENGTH_HEADER} ({value}) is larger than the body ({body_length} bytes)")
    return value


def _bool_param(params: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    value = params.get(key, default)
    if type(value) is not bool:
        raise TensorCodecError(f"{where}: parameter {key!r} must be true or false")
    return value


def _parse_outputs(raw: Any, default_binary: bool) -> list[RequestedOutput]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise TensorCodecError("'outputs' must be a list")
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise TensorCodecError(f"outputs[{i}] must be an object with a non-empty string 'name'")
        name = entry["name"]
        if name in seen:
            raise TensorCodecError(f"output {short_repr(name)} is requested twice")
        seen.add(name)
        params = entry.get("parameters", {})
        if not isinstance(params, Mapping):
            raise TensorCodecError(f"output {short_repr(name)}: parameters must be a JSON object")
        binary = _bool_param(params, "binary_data", default_binary, f"output {short_repr(name)}")
        outputs.append(RequestedOutput(name, binary, dict(params)))
    return outputs


def parse_infer_request(body: bytes, header_length: Any = None) -> InferRequest:
    """Decode a v2 infer request body: plain JSON, or JSON header + binary blobs when
    ``header_length`` (the ``Inference-Header-Content-Length`` value) is given."""
    view = memoryview(body).cast("B")
    length = parse_header_length(header_length, len(view))
    head = view if length is None else view[:length]
    try:
        doc = json.loads(bytes(head))
    except (ValueError, RecursionError):
        raise TensorCodecError("request body is not valid JSON") from None
    if has_lone_surrogate(bytes(head), doc):
        raise TensorCodecError("request body is not valid JSON: it holds an unpaired UTF-16 surrogate")
    if not isinstance(doc, dict):
        raise TensorCodecError("request body must be a JSON object")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise TensorCodecError("'id' must be a string")
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise TensorCodecError("'parameters' must be a JSON object")
    binary_output = _bool_param(params, "binary_data_output", False, "request")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise TensorCodecError("request needs an 'inputs' list")

    blobs = view[len(view) if length is None else length :]
    offset = 0
    inputs: list[InputTensor] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_inputs):
        name, datatype, shape, tparams = _tensor_header(raw, f"inputs[{i}]")
        label = f"input {short_repr(name)}"
        if name in seen:
            raise TensorCodecError(f"{label} is given twice")
        seen.add(name)
        if "shared_memory_region" in tparams:
            raise TensorCodecError(f"{label}: shared-memory inputs are not supported")
        size = tparams.get("binary_data_size")
        if size is None:
            inputs.append(decode_json_tensor(raw))
            continue
        if length is None:
            raise TensorCodecError(f"{label} has binary_data_size but no {HEADER_LENGTH_HEADER} was sent")
        if type(size) is not int or size < 0:
            raise TensorCodecError(f"{label}: binary_data_size must be a non-negative integer")
        if "data" in raw:
            raise TensorCodecError(f"{label} has both 'data' and binary_data_size")
        if size > len(blobs) - offset:
            left = len(blobs) - offset
            raise TensorCodecError(f"{label}: binary_data_size {size} is larger than the {left} byte(s) left")
        array = decode_binary_tensor(datatype, shape, blobs[offset : offset + size], label)
        offset += size
        inputs.append(InputTensor(name, datatype, array, tparams))
    if offset != len(blobs):
        raise TensorCodecError(f"request body has {len(blobs) - offset} byte(s) not claimed by any input")
    return InferRequest(
        inputs=inputs,
        outputs=_parse_outputs(doc.get("outputs"), binary_output),
        id=request_id,
        parameters=dict(params),
        binary_data_output=binary_output,
    )


def build_infer_response(
    model_name: str,
    outputs: Sequence[OutputTensor],
    *,
    request: InferRequest | None = None,
    model_version: str | None = None,
    request_id: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, int | None]:
    """Encode a v2 infer response. Outputs the request asked for as binary go after the JSON
    header; returns ``(body, header_length)``, header_length None when the body is plain JSON
    (otherwise send it as ``Inference-Header-Content-Length``)."""
    doc: dict[str, Any] = {"model_name": model_name}
    if model_version is not None:
        doc["model_version"] = str(model_version)
    rid = request_id if request_id is not None else (request.id if request is not None else None)
    if rid:
        doc["id"] = rid
    if parameters:
        doc["parameters"] = dict(parameters)
    entries: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for out in outputs:
        array = np.asarray(out.array)
        datatype = out.datatype or datatype_of(array)
        if request is not None and request.wants_binary(out.name):
            blob = encode_binary_tensor(array, datatype)
            blobs.append(blob)
            params = {**out.parameters, "binary_data_size": len(blob)}
            entries.append({"name": out.name, "datatype": datatype, "shape": list(array.shape), "parameters": params})
        else:
            entries.append(encode_json_tensor(out.name, array, datatype, out.parameters))
    doc["outputs"] = entries
    head = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    if not blobs:
        return head, None
    return b"".join([head, *blobs]), len(head)


# ---------------------------------------------------------------- gRPC raw contents


def decode_raw_input_contents(inputs: Sequence[Any], raw_contents: Sequence[bytes]) -> list[InputTensor]:
    """Decode gRPC ``raw_input_contents``: ``inputs`` are ``{"name","datatype","shape","parameters"?}``
    mappings (one per ModelInferRequest input), ``raw_contents[i]`` belongs to ``inputs[i]``."""
    if len(raw_contents) != len(inputs):
        raise TensorCodecError(f"raw_input_contents has {len(raw_contents)} entries for {len(inputs)} inputs")
    decoded: list[InputTensor] = []
    seen: set[str] = set()
    for i, (spec, blob) in enumerate(zip(inputs, raw_contents, strict=True)):
        name, datatype, shape, params = _tensor_header(spec, f"inputs[{i}]")
        if name in seen:
            raise TensorCodecError(f"input {short_repr(name)} is given twice")
        seen.add(name)
        array = decode_binary_tensor(datatype, shape, blob, f"input {short_repr(name)}")
        decoded.append(InputTensor(name, datatype, array, params))
    return decoded


def encode_raw_output_contents(outputs: Sequence[OutputTensor]) -> tuple[list[dict[str, Any]], list[bytes]]:
    """gRPC response pieces: per-output ``{"name","datatype","shape"}`` metadata and the matching
    ``raw_output_contents`` blobs, in the same order."""
    metadata: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for out in outputs:
        array = np.asarray(out.array)
        datatype = out.datatype or datatype_of(array)
        metadata.append({"name": out.name, "datatype": datatype, "shape": list(array.shape)})
        blobs.append(encode_binary_tensor(array, datatype))
    return metadata, blobs
