"""KServe v2 tensor codec: JSON, binary extension and gRPC raw contents, good and bad input."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from gateway.kserve.codec import (
    DATATYPES,
    InferRequest,
    OutputTensor,
    RequestedOutput,
    TensorCodecError,
    build_infer_response,
    datatype_of,
    decode_binary_tensor,
    decode_json_tensor,
    decode_raw_input_contents,
    encode_binary_tensor,
    encode_json_tensor,
    encode_raw_output_contents,
    numpy_dtype,
    parse_header_length,
    parse_infer_request,
)

# One sample per datatype, including each type's extremes.
SAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    **{
        name: np.array([[info.min, info.max, 0], [1, 2, 3]], dtype=dt)
        for name, dt in DATATYPES.items()
        if dt.kind in "iu"
        for info in [np.iinfo(dt)]
    },
    "FP16": np.array([[0.5, -1.25, 65504.0], [0.0, 1e-3, -65504.0]], dtype=np.float16),
    "FP32": np.array([[0.1, -3.4e38, 3.4e38], [1e-30, 0.0, 7.0]], dtype=np.float32),
    "FP64": np.array([[0.1, -1.7e308, 1.7e308], [5e-324, 0.0, 7.0]], dtype=np.float64),
    "BF16": np.array([[1.0, -2.5, 0.15625], [256.0, 0.0, -3.0]], dtype=np.float32),
    "BYTES": np.array([[b"", b"hello", "héllo".encode()], [b"a b", b"\x00x", b"zz"]], dtype=object),
}


def binary_body(header: dict, *blobs: bytes) -> tuple[bytes, str]:
    head = json.dumps(header).encode()
    return head + b"".join(blobs), str(len(head))


def split_response(body: bytes, header_length: int | None) -> tuple[dict, bytes]:
    if header_length is None:
        return json.loads(body), b""
    return json.loads(body[:header_length]), body[header_length:]


def assert_same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tolist() == b.tolist()


# ------------------------------------------------------------------ datatypes


def test_every_listed_datatype_is_known():
    assert set(DATATYPES) == set(SAMPLES)
    assert numpy_dtype("BF16") == np.float32 and numpy_dtype("BYTES") == np.dtype(object)
    assert datatype_of(np.zeros(1, np.float16)) == "FP16"
    assert datatype_of(np.zeros(1, np.dtype(">i4"))) == "INT32"
    assert datatype_of(np.array(["a"])) == "BYTES" and datatype_of(np.array([b"a"])) == "BYTES"


@pytest.mark.parametrize("bad", ["FLOAT32", "fp32", "", None, 3, ["FP32"]])
def test_unknown_datatype(bad):
    with pytest.raises(TensorCodecError, match="unknown datatype"):
        numpy_dtype(bad)


def test_unsupported_numpy_dtype():
    with pytest.raises(TensorCodecError, match="no KServe v2 datatype"):
        datatype_of(np.zeros(1, np.complex64))


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_json_round_trip(datatype):
    array = SAMPLES[datatype]
    entry = json.loads(json.dumps(encode_json_tensor("x", array, datatype)))
    assert entry["datatype"] == datatype and entry["shape"] == [2, 3] and len(entry["data"]) == 6
    decoded = decode_json_tensor(entry)
    assert decoded.name == "x" and decoded.datatype == datatype
    assert_same(decoded.array, array)


@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_binary_round_trip(datatype):
    array = SAMPLES[datatype]
    blob = encode_binary_tensor(array, datatype)
    assert_same(decode_binary_tensor(datatype, [2, 3], blob), array)


def test_binary_layout_is_little_endian_row_major():
    array = np.array([[1, 2], [3, 256]], dtype=">i4")
    assert encode_binary_tensor(array) == struct.pack("<4i", 1, 2, 3, 256)
    assert encode_binary_tensor(np.array([[1, 2], [3, 4]], np.int16).T) == struct.pack("<4h", 1, 3, 2, 4)
    assert encode_binary_tensor(np.array([b"ab", "é"], dtype=object)) == b"\x02\x00\x00\x00ab\x02\x00\x00\x00\xc3\xa9"
    assert encode_binary_tensor(np.array([True, False])) == b"\x01\x00"


def test_decoded_binary_arrays_are_writable_copies():
    blob = bytearray(struct.pack("<2f", 1.0, 2.0))
    array = decode_binary_tensor("FP32", [2], blob)
    blob[:4] = b"\x00" * 4
    array[1] = 5.0
    assert array.tolist() == [1.0, 5.0]


def test_bf16_rounds_to_nearest_even_and_keeps_nan():
    values = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, np.nan, -np.inf], dtype=np.float32)
    values[2] = np.array([0x7F800001], np.uint32).view(np.float32)[0]  # a NaN that naive rounding turns into inf
    bits = struct.unpack("<4H", encode_binary_tensor(values, "BF16"))
    assert bits[:2] == (0x3F80, 0x3F82)  # ties go to the even mantissa
    assert bits[2] & 0x7F80 == 0x7F80 and bits[2] & 0x7F and bits[3] == 0xFF80
    decoded = decode_binary_tensor("BF16", [4], encode_binary_tensor(values, "BF16"))
    assert decoded[0] == 1.0 and np.isnan(decoded[2]) and decoded[3] == -np.inf


def test_nested_and_flat_json_data_agree():
    flat = decode_json_tensor({"name": "a", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]})
    nested = decode_json_tensor({"name": "a", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]})
    assert_same(flat.array, nested.array)
    assert flat.array.tolist() == [[1, 2], [3, 4]]


def test_json_bytes_are_utf8_and_ints_are_accepted_as_floats():
    doc = {"name": "s", "datatype": "BYTES", "shape": [2], "data": ["héllo", ""], "parameters": {"p": 1}}
    t = decode_json_tensor(doc)
    assert t.array.tolist() == ["héllo".encode(), b""] and t.parameters == {"p": 1}
    floats = decode_json_tensor({"name": "f", "datatype": "FP32", "shape": [2], "data": [1, 2.5]})
    assert floats.array.tolist() == [1.0, 2.5]


def test_empty_tensor():
    t = decode_json_tensor({"name": "e", "datatype": "FP32", "shape": [0, 3], "data": []})
    assert t.array.shape == (0, 3)
    assert decode_binary_tensor("BYTES", [2, 0], b"").shape == (2, 0)


def test_non_utf8_bytes_output_needs_binary():
    with pytest.raises(TensorCodecError, match="binary_data"):
        encode_json_tensor("o", np.array([b"\xff"], dtype=object))


# ------------------------------------------------------------------ binary requests / responses


def test_binary_request_mixes_json_and_blobs_in_order():
    a, s = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([b"x", b"yz"], dtype=object)
    header = {
        "id": "r1",
        "parameters": {"binary_data_output": True},
        "inputs": [
            {"name": "A", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}},
            {"name": "J", "datatype": "INT64", "shape": [1], "data": [7]},
            {"name": "S", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 11}},
        ],
        "outputs": [{"name": "O1"}, {"name": "O2", "parameters": {"binary_data": False}}],
    }
    body, length = binary_body(header, encode_binary_tensor(a), encode_binary_tensor(s))
    req = parse_infer_request(body, length)
    assert [t.name for t in req.inputs] == ["A", "J", "S"]
    assert_same(req.inputs[0].array, a)
    assert req.inputs[1].array.tolist() == [7]
    assert_same(req.inputs[2].array, s)
    assert req.id == "r1" and req.binary_data_output
    assert [(o.name, o.binary) for o in req.outputs] == [("O1", True), ("O2", False)]
    assert req.wants_binary("unlisted")


def test_plain_json_request_with_and_without_header_length():
    doc = {"inputs": [{"name": "x", "datatype": "BOOL", "shape": [1], "data": [True]}]}
    body = json.dumps(doc).encode()
    for length in (None, len(body), str(len(body)), f" {len(body)} "):
        req = parse_infer_request(body, length)
        assert req.inputs[0].array.tolist() == [True] and req.outputs == [] and not req.wants_binary("y")


def test_response_binary_outputs_follow_header():
    req = InferRequest(inputs=[], outputs=[RequestedOutput("B", True), RequestedOutput("J", False)], id="7")
    outs = [
        OutputTensor("B", np.array([[1.5, 2.5]], np.float32)),
        OutputTensor("J", np.array([3], np.int8), parameters={"note": "x"}),
        OutputTensor("T", np.array([b"hi"], dtype=object)),
    ]
    body, length = build_infer_response("m", outs, request=req, model_version="1")
    doc, blobs = split_response(body, length)
    assert doc["model_name"] == "m" and doc["model_version"] == "1" and doc["id"] == "7"
    b, j, t = doc["outputs"]
    assert b == {"name": "B", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}}
    assert j == {"name": "J", "datatype": "INT8", "shape": [1], "parameters": {"note": "x"}, "data": [3]}
    assert t["data"] == ["hi"]
    assert decode_binary_tensor("FP32", b["shape"], blobs).tolist() == [[1.5, 2.5]]


def test_response_binary_data_output_applies_to_all_outputs():
    req = parse_infer_request(b'{"inputs": [], "parameters": {"binary_data_output": true}}')
    outs = [OutputTensor("S", np.array([b"ab", b""], dtype=object)), OutputTensor("H", np.ones(2, np.float32), "BF16")]
    body, length = build_infer_response("m", outs, request=req)
    doc, blobs = split_response(body, length)
    sizes = [o["parameters"]["binary_data_size"] for o in doc["outputs"]]
    assert sizes == [10, 4] and len(blobs) == 14 and "id" not in doc
    assert decode_binary_tensor("BYTES", [2], blobs[:10]).tolist() == [b"ab", b""]
    assert decode_binary_tensor("BF16", [2], blobs[10:]).tolist() == [1.0, 1.0]


def test_response_without_request_is_plain_json():
    body, length = build_infer_response("m", [OutputTensor("o", np.zeros((1, 2), np.uint16))], request_id="q")
    assert length is None
    assert json.loads(body) == {
        "model_name": "m",
        "id": "q",
        "outputs": [{"name": "o", "datatype": "UINT16", "shape": [1, 2], "data": [0, 0]}],
    }


# ------------------------------------------------------------------ gRPC raw contents


def test_grpc_raw_contents_round_trip():
    outs = [
        OutputTensor("a", SAMPLES["INT16"]),
        OutputTensor("b", SAMPLES["BYTES"]),
        OutputTensor("c", SAMPLES["BF16"], "BF16"),
    ]
    meta, raw = encode_raw_output_contents(outs)
    assert [m["datatype"] for m in meta] == ["INT16", "BYTES", "BF16"] and all(isinstance(r, bytes) for r in raw)
    decoded = decode_raw_input_contents(meta, raw)
    for out, got in zip(outs, decoded, strict=True):
        assert got.name == out.name
        assert_same(got.array, out.array)


def test_grpc_raw_contents_errors():
    spec = [{"name": "a", "datatype": "INT32", "shape": [2]}]
    with pytest.raises(TensorCodecError, match="1 inputs"):
        decode_raw_input_contents(spec, [])
    with pytest.raises(TensorCodecError, match="needs 2"):
        decode_raw_input_contents(spec, [b"\x00" * 4])
    with pytest.raises(TensorCodecError, match="twice"):
        decode_raw_input_contents(spec * 2, [b"\x00" * 8] * 2)


# ------------------------------------------------------------------ malformed input


def tensor(datatype="INT32", shape=(2,), data=(1, 2), **extra):
    return {"name": "x", "datatype": datatype, "shape": list(shape), "data": list(data), **extra}


@pytest.mark.parametrize(
    "doc, fragment",
    [
        (tensor(shape=[3]), "needs 3"),
        (tensor(shape=[2, 2]), "needs 4"),
        (tensor(data=[[1, 2], [3]]), "needs 2"),
        (tensor(shape=[-1]), "non-negative"),
        (tensor(shape=[2.0]), "non-negative"),
        (tensor(shape=[True, 2]), "non-negative"),
        (tensor(shape=[0, 2**70], data=[]), "non-negative"),
        (tensor(shape=[0, 2**62, 2**62], data=[]), "too large"),
        ({**tensor(), "shape": "2"}, "shape must be a list"),
        ({k: v for k, v in tensor().items() if k != "shape"}, "no 'shape'"),
        (tensor(datatype="FLOAT"), "unknown datatype"),
        (tensor(datatype="UINT8", data=[1, 256]), "out of range"),
        (tensor(datatype="UINT64", data=[-1, 0]), "out of range"),
        (tensor(datatype="UINT64", data=[2**64, 0]), "out of range"),
        (tensor(datatype="INT8", data=[-129, 0]), "out of range"),
        (tensor(data=[1.5, 2]), "integers"),
        (tensor(data=[True, 2]), "integers"),
        (tensor(datatype="FP32", data=["1", 2]), "numbers"),
        (tensor(datatype="FP32", data=[1e39, 2]), "out of range"),
        (tensor(datatype="FP16", data=[70000, 2]), "out of range"),
        (tensor(datatype="FP64", data=[10**400, 2]), "out of range"),
        (tensor(datatype="BOOL", data=[1, 0]), "true/false"),
        (tensor(datatype="BYTES", data=[1, "a"]), "strings"),
        (tensor(datatype="BYTES", data=["\ud800", "a"]), "UTF-8"),
        (tensor(data=[{"a": 1}, 2]), "integers"),
        ({**tensor(), "data": 5}, "must be a list"),
        ({k: v for k, v in tensor().items() if k != "data"}, "no 'data'"),
        ({**tensor(), "name": ""}, "name"),
        ({**tensor(), "parameters": [1]}, "parameters"),
        ("x", "JSON object"),
    ],
)
def test_malformed_json_tensor(doc, fragment):
    with pytest.raises(TensorCodecError, match=fragment):
        decode_json_tensor(doc)


def test_deeply_nested_data_is_rejected_without_recursion():
    data: list = [1]
    for _ in range(10_000):
        data = [data]
    with pytest.raises(TensorCodecError, match="nested too deeply"):
        decode_json_tensor(tensor(shape=[1], data=data))


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


@pytest.mark.parametrize(
    "datatype, shape, blob, fragment",
    [
        ("BYTES", [1], u32(100) + b"abc", "claims 100 bytes but only 3 remain"),
        ("BYTES", [1], u32(2**32 - 1), "claims 4294967295"),
        ("BYTES", [2], u32(1) + b"a" + b"\x01\x00\x00\x00", "claims 1 bytes but only 0"),
        ("BYTES", [2], u32(3) + b"abc" + b"\x00\x00", "ends before element 1"),
        ("BYTES", [1], u32(1) + b"ab", "1 unexpected byte"),
        ("BYTES", [0], b"x", "unexpected byte"),
        ("BYTES", [2**40], u32(0) * 2, "cannot hold"),
        ("FP32", [2**40], b"\x00" * 8, "needs 1099511627776"),
        ("INT32", [3], b"\x00" * 8, "8 bytes instead of 12"),
        ("FP16", [2], b"\x00" * 5, "instead of 4"),
        ("NOPE", [1], b"", "unknown datatype"),
    ],
)
def test_malformed_binary_tensor(datatype, shape, blob, fragment):
    with pytest.raises(TensorCodecError, match=fragment):
        decode_binary_tensor(datatype, shape, blob)


BIN_INPUT = {"name": "b", "datatype": "INT32", "shape": [2], "parameters": {"binary_data_size": 8}}


@pytest.mark.parametrize(
    "header, blobs, length, fragment",
    [
        ({"inputs": [BIN_INPUT]}, b"\x00" * 4, None, "larger than the 4 byte"),
        ({"inputs": [BIN_INPUT, BIN_INPUT]}, b"\x00" * 12, None, "given twice"),
        ({"inputs": [{**BIN_INPUT, "name": "c"}, BIN_INPUT]}, b"\x00" * 12, None, "larger than the 4 byte"),
        ({"inputs": [BIN_INPUT]}, b"\x00" * 9, None, "1 byte"),
        ({"inputs": [{**BIN_INPUT, "parameters": {"binary_data_size": -8}}]}, b"\x00" * 8, None, "non-negative"),
        ({"inputs": [{**BIN_INPUT, "parameters": {"binary_data_size": "8"}}]}, b"\x00" * 8, None, "non-negative"),
        ({"inputs": [{**BIN_INPUT, "data": [1, 2]}]}, b"\x00" * 8, None, "both"),
        ({"inputs": [{**BIN_INPUT, "shape": [3]}]}, b"\x00" * 8, None, "needs 3"),
        ({"inputs": [{**BIN_INPUT, "parameters": {"shared_memory_region": "r"}}]}, b"", None, "shared-memory"),
        ({"inputs": [BIN_INPUT]}, b"\x00" * 8, "1000", "larger than the body"),
        ({"inputs": [BIN_INPUT]}, b"\x00" * 8, "-5", "non-negative integer"),
        ({"inputs": [BIN_INPUT]}, b"\x00" * 8, -5, "non-negative integer"),
        ({"inputs": [BIN_INPUT]}, b"\x00" * 8, "12.5", "non-negative integer"),
        ({"inputs": [BIN_INPUT]}, b"\x00" * 8, "abc", "non-negative integer"),
        ({"inputs": [BIN_INPUT]}, b"\x00" * 8, "", "non-negative integer"),
        ({"inputs": [BIN_INPUT]}, b"\x00" * 8, True, "non-negative integer"),
        ({"inputs": [BIN_INPUT]}, b"\x00" * 8, "9" * 30, "non-negative integer"),
        ({"inputs": [BIN_INPUT]}, b"\x00" * 8, "3", "not valid JSON"),
        ({"inputs": "x"}, b"", None, "'inputs' list"),
        ({}, b"", None, "'inputs' list"),
        ({"inputs": [5]}, b"", None, r"inputs\[0\] must be a JSON object"),
        ({"inputs": [], "id": 5}, b"", None, "'id'"),
        ({"inputs": [], "parameters": []}, b"", None, "'parameters'"),
        ({"inputs": [], "parameters": None}, b"", None, "'parameters'"),
        ({"inputs": [], "outputs": [{"name": "o", "parameters": []}]}, b"", None, "parameters must be"),
        ({"inputs": [], "parameters": {"binary_data_output": 1}}, b"", None, "binary_data_output"),
        ({"inputs": [], "outputs": {"name": "o"}}, b"", None, "'outputs' must be a list"),
        ({"inputs": [], "outputs": [{"name": 3}]}, b"", None, "outputs\\[0\\]"),
        ({"inputs": [], "outputs": [{"name": "o"}, {"name": "o"}]}, b"", None, "twice"),
        ({"inputs": [], "outputs": [{"name": "o", "parameters": {"binary_data": "yes"}}]}, b"", None, "binary_data"),
    ],
)
def test_malformed_binary_request(header, blobs, length, fragment):
    body, own_length = binary_body(header, blobs)
    with pytest.raises(TensorCodecError, match=fragment):
        parse_infer_request(body, own_length if length is None else length)


def test_binary_data_size_needs_header_length():
    body, _ = binary_body({"inputs": [BIN_INPUT]})
    with pytest.raises(TensorCodecError, match="Inference-Header-Content-Length"):
        parse_infer_request(body)


@pytest.mark.parametrize("body", [b"[]", b'"x"', b"5", b"null", b"{", b"\xff\xfe\x00", b"", b"[" * 100_000])
def test_non_object_or_invalid_json(body):
    with pytest.raises(TensorCodecError, match="JSON"):
        parse_infer_request(body)


def test_errors_are_value_errors_with_short_messages():
    huge = "n" * 10_000
    with pytest.raises(ValueError) as info:
        parse_infer_request(json.dumps({"inputs": [tensor(shape=[3]) | {"name": huge}]}).encode())
    assert isinstance(info.value, TensorCodecError) and len(str(info.value)) < 200


def test_parse_header_length_accepts_exact_body_length():
    assert parse_header_length("10", 10) == 10 and parse_header_length(None, 0) is None
