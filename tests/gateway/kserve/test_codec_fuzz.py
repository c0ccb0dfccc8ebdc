"""v2 infer bodies drawn by hypothesis: inputs of every datatype with shapes, claimed binary sizes, header lengths
and blobs that agree or not (huge dimensions, sizes past the body, BYTES length prefixes past their blob, JSON data
nested or of the wrong kind). Each body decodes to tensors of the claimed shapes or is one TensorCodecError, and
decoding never holds much more memory than the body (bench/fuzz_targets.py's kserve-body target mutates bytes)."""

from __future__ import annotations

import json
import math
import struct
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.kserve.codec import DATATYPES, TensorCodecError, decode_raw_input_contents, parse_infer_request

DIMS = st.one_of(st.integers(0, 4), st.sampled_from((2**31, 2**32, 2**62, 2**63 - 1, -1)))
SCALARS = st.one_of(
    st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.booleans(), st.text(max_size=4), st.none()
)
DATA = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5), max_leaves=20)


@st.composite
def bodies(draw: st.DrawFn) -> tuple[bytes, str | None]:
    inputs, blobs = [], []
    for i in range(draw(st.integers(0, 3))):
        entry = {
            "name": draw(st.sampled_from((f"in{i}", "x", ""))),
            "datatype": draw(st.sampled_from((*DATATYPES, "FP8", 7))),
            "shape": draw(st.lists(DIMS, max_size=3)),
        }
        if draw(st.booleans()):
            blob = draw(st.binary(max_size=64))
            if entry["datatype"] == "BYTES" and draw(st.booleans()):  # length-prefixed elements, some lying
                parts = draw(st.lists(st.binary(max_size=6), max_size=3))
                blob = b"".join(
                    struct.pack("<I", draw(st.sampled_from((len(p), len(p) + 1, 2**32 - 1)))) + p for p in parts
                )
            size = draw(st.sampled_from((len(blob), len(blob) + 1, max(len(blob) - 1, 0), 2**40)))
            entry["parameters"] = {"binary_data_size": size}
            blobs.append(blob)
        else:
            entry["data"] = draw(DATA)
        inputs.append(entry)
    doc = {"inputs": inputs, "outputs": draw(st.sampled_from(([], [{"name": "y"}], [{"name": 3}], "x")))}
    head = json.dumps(doc).encode()
    header = draw(st.sampled_from((None, str(len(head)), str(len(head) + 1), "-1", "99999999999999999999", "x")))
    return head + b"".join(blobs), header


@settings(max_examples=400, deadline=None, database=None, derandomize=True)
@given(body=bodies())
def test_bodies_decode_or_are_one_codec_error(body: tuple[bytes, str | None]) -> None:
    data, header = body
    tracemalloc.start()
    try:
        request = parse_infer_request(data, header)
    except TensorCodecError:
        return
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < (1 << 20) + 64 * len(data), peak
    for tensor in request.inputs:
        assert tensor.array.size == math.prod(tensor.array.shape)


@settings(max_examples=200, deadline=None, database=None, derandomize=True)
@given(datatype=st.sampled_from(sorted(DATATYPES)), shape=st.lists(DIMS, max_size=3), blob=st.binary(max_size=64))
def test_grpc_raw_contents_decode_or_are_one_codec_error(datatype: str, shape: list[int], blob: bytes) -> None:
    try:
        (tensor,) = decode_raw_input_contents([{"name": "x", "datatype": datatype, "shape": shape}], [blob])
    except TensorCodecError:
        return
    assert list(tensor.array.shape) == shape
