"""Triton config.pbtxt reader: realistic configs, every scalar form, and located errors."""

from __future__ import annotations

import math

import pytest

from gateway.repository.pbtxt import KNOWN_MAPS, KNOWN_REPEATED, PbtxtError, as_list, parse_pbtxt

DYNAMIC = """
# An image classifier with dynamic batching.
name: "resnet"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [
  {
    name: "INPUT__0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
  }
]
output [
  {
    name: "OUTPUT__0"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    label_filename: "labels.txt"
  }
]
instance_group [
  { count: 2 kind: KIND_CPU },
  { count: 1, kind: KIND_GPU, gpus: [ 0, 1 ] }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  preserve_ordering: true
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy {
    timeout_action: DELAY
    default_timeout_microseconds: 5000
    allow_timeout_override: true
    max_queue_size: 32
  }
  priority_queue_policy { key: 1 value: { timeout_action: REJECT max_queue_size: 4 } }
}
version_policy: { latest { num_versions: 2 } }
"""

SEQUENCE = """
name: "accumulator"
backend: "python"
max_batch_size: 8
input { name: "INPUT" data_type: TYPE_INT32 dims: 1 }
output { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 4 preferred_batch_size: 2 max_queue_delay_microseconds: 100 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [
    {
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_INT32
      dims: [ -1 ]
      initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "initial state" }
    }
  ]
}
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

ENSEMBLE = """
name: "embed"
platform: "ensemble"
max_batch_size: 4
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 384 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "tokenizer"
      model_version: -1
      input_map { key: "TEXT" value: "TEXT" }
      output_map { key: "IDS" value: "ids" }
      output_map { key: "MASK" value: "mask" }
    },
    {
      model_name: "encoder"
      model_version: 3
      input_map [ { key: "input_ids", value: "ids" }, { key: "attention_mask", value: "mask" } ]
      output_map: { key: "embeddings" value: "EMBEDDING" }
    }
  ]
}
"""

EXTRAS = """
name: "llm"; backend: "python";
max_batch_size: 0
model_transaction_policy { decoupled: True }
parameters: { key: "EXECUTION_ENV_PATH", value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }
parameters { key: "max_tokens" value { string_value: "128" } }
model_warmup [
  {
    name: "zeros"
    batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
    inputs { key: "INPUT1" value: { data_type: TYPE_STRING dims: 1 input_data_file: "raw_text" } }
    count: 3
  }
]
optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } }
response_cache { enable: true }
version_policy: { specific { versions: [ 1, 3 ] } }
"""


def test_dynamic_batching_config():
    cfg = parse_pbtxt(DYNAMIC)
    assert cfg["name"] == "resnet" and cfg["platform"] == "onnxruntime_onnx" and cfg["max_batch_size"] == 16
    assert cfg["input"] == [
        {"name": "INPUT__0", "data_type": "TYPE_FP32", "format": "FORMAT_NCHW", "dims": [3, 224, 224]}
    ]
    assert cfg["output"][0]["label_filename"] == "labels.txt"
    assert cfg["instance_group"] == [{"count": 2, "kind": "KIND_CPU"}, {"count": 1, "kind": "KIND_GPU", "gpus": [0, 1]}]
    db = cfg["dynamic_batching"]
    assert db["preferred_batch_size"] == [4, 8] and db["max_queue_delay_microseconds"] == 100
    assert db["preserve_ordering"] is True and db["priority_levels"] == 2 and db["default_priority_level"] == 1
    assert db["default_queue_policy"] == {
        "timeout_action": "DELAY",
        "default_timeout_microseconds": 5000,
        "allow_timeout_override": True,
        "max_queue_size": 32,
    }
    assert db["priority_queue_policy"] == {1: {"timeout_action": "REJECT", "max_queue_size": 4}}
    assert cfg["version_policy"] == {"latest": {"num_versions": 2}}
    assert list(cfg) == [
        "name",
        "platform",
        "max_batch_size",
        "input",
        "output",
        "instance_group",
        "dynamic_batching",
        "version_policy",
    ]


def test_sequence_batching_config():
    cfg = parse_pbtxt(SEQUENCE)
    assert cfg["input"] == [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [1]}]
    assert cfg["output"][0]["dims"] == [1]
    sb = cfg["sequence_batching"]
    assert sb["max_sequence_idle_microseconds"] == 5_000_000
    oldest = {"max_candidate_sequences": 4, "preferred_batch_size": [2], "max_queue_delay_microseconds": 100}
    assert sb["oldest"] == oldest
    controls = {c["name"]: c["control"] for c in sb["control_input"]}
    assert list(controls) == ["START", "END", "READY", "CORRID"]
    assert controls["START"] == [{"kind": "CONTROL_SEQUENCE_START", "fp32_false_true": [0, 1]}]
    assert controls["END"][0]["int32_false_true"] == [0, 1]
    assert controls["READY"][0]["bool_false_true"] == [False, True]
    assert controls["CORRID"] == [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}]
    (state,) = sb["state"]
    assert state["input_name"] == "INPUT_STATE" and state["output_name"] == "OUTPUT_STATE" and state["dims"] == [-1]
    initial = {"data_type": "TYPE_INT32", "dims": [1], "zero_data": True, "name": "initial state"}
    assert state["initial_state"] == [initial]


def test_ensemble_config():
    steps = parse_pbtxt(ENSEMBLE)["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["tokenizer", "encoder"]
    assert steps[0]["model_version"] == -1 and steps[1]["model_version"] == 3
    assert steps[0]["input_map"] == {"TEXT": "TEXT"}
    assert steps[0]["output_map"] == {"IDS": "ids", "MASK": "mask"}
    assert steps[1]["input_map"] == {"input_ids": "ids", "attention_mask": "mask"}
    assert steps[1]["output_map"] == {"embeddings": "EMBEDDING"}


def test_parameters_warmup_and_policies():
    cfg = parse_pbtxt(EXTRAS)
    assert cfg["name"] == "llm" and cfg["backend"] == "python" and cfg["max_batch_size"] == 0
    assert cfg["model_transaction_policy"] == {"decoupled": True}
    assert cfg["parameters"] == {
        "EXECUTION_ENV_PATH": {"string_value": "$$TRITON_MODEL_DIRECTORY/env.tar.gz"},
        "max_tokens": {"string_value": "128"},
    }
    (warmup,) = cfg["model_warmup"]
    assert warmup["name"] == "zeros" and warmup["batch_size"] == 1 and warmup["count"] == 3
    assert warmup["inputs"] == {
        "INPUT0": {"data_type": "TYPE_FP32", "dims": [16], "zero_data": True},
        "INPUT1": {"data_type": "TYPE_STRING", "dims": [1], "input_data_file": "raw_text"},
    }
    accel = cfg["optimization"]["execution_accelerators"]["cpu_execution_accelerator"]
    assert accel == [{"name": "openvino"}]
    assert cfg["response_cache"] == {"enable": True}
    assert cfg["version_policy"] == {"specific": {"versions": [1, 3]}}
    assert parse_pbtxt("version_policy: { all: {} }")["version_policy"] == {"all": {}}


def test_later_map_entries_win():
    src = 'parameters { key: "a" value: "1" } parameters: [{ key: "a" value: "2" }]'
    assert parse_pbtxt(src) == {"parameters": {"a": "2"}}


def test_schema_free_view_keeps_single_fields_scalar():
    cfg = parse_pbtxt('dims: 3 x: 1 x: 2 y: [] parameters { key: "k" value: "v" }', repeated=(), maps=())
    assert cfg == {"dims": 3, "x": [1, 2], "y": [], "parameters": {"key": "k", "value": "v"}}
    assert "dims" in KNOWN_REPEATED and "parameters" in KNOWN_MAPS


def test_repeated_forms_merge_in_order():
    cfg = parse_pbtxt("n: 1 n: [2, 3] n: 4 m [ {a: 1}, <a: 2> ] m { a: 3 }")
    assert cfg == {"n": [1, 2, 3, 4], "m": [{"a": 1}, {"a": 2}, {"a": 3}]}
    assert parse_pbtxt("dims: [ 1, 2, ]")["dims"] == [1, 2]


def test_as_list():
    assert as_list(None) == [] and as_list(5) == [5] and as_list([1, 2]) == [1, 2]
    assert as_list({"a": 1}) == [{"a": 1}] and as_list((1,)) == [1]


# ------------------------------------------------------------------ scalars and syntax


@pytest.mark.parametrize(
    "source, expected",
    [
        ("v: 42", 42),
        ("v: -7", -7),
        ("v: +7", 7),
        ("v: 0", 0),
        ("v: 0x1F", 31),
        ("v: -0x10", -16),
        ("v: 017", 15),
        ("v: 18446744073709551615", 2**64 - 1),
        ("v: 1.5", 1.5),
        ("v: -.5", -0.5),
        ("v: 5.", 5.0),
        ("v: 1e3", 1000.0),
        ("v: 2.5E-2", 0.025),
        ("v: 2.0f", 2.0),
        ("v: 3F", 3.0),
        ("v: inf", math.inf),
        ("v: -Infinity", -math.inf),
        ("v: true", True),
        ("v: False", False),
        ("v: TYPE_FP32", "TYPE_FP32"),
        ("v: KIND_CPU", "KIND_CPU"),
        ('v: "plain"', "plain"),
        ("v: 'single \"q\"'", 'single "q"'),
        (r'v: "a\n\t\"\'\\b"', "a\n\t\"'\\b"),
        (r'v: "\101\x42\u00e9\U0001F600"', "ABé😀"),
        (r'v: "\303\251"', "é"),
        ('v: "ab" \'cd\'\n "ef"', "abcdef"),
        ('v: "a # not a comment"', "a # not a comment"),
        ('v: "héllo"', "héllo"),
    ],
)
def test_scalars(source, expected):
    value = parse_pbtxt(source, repeated=())["v"]
    assert value == expected and type(value) is type(expected)


def test_nan():
    assert math.isnan(parse_pbtxt("v: nan")["v"]) and math.isnan(parse_pbtxt("v: -NaN")["v"])


def test_separators_comments_and_empty_input():
    src = "a: 1, b: 2; c { d: 3; }, # trailing comment\n# whole-line comment\ne: [1, # inside a list\n 2]"
    assert parse_pbtxt(src) == {"a": 1, "b": 2, "c": {"d": 3}, "e": [1, 2]}
    assert parse_pbtxt("") == {} and parse_pbtxt("  # only a comment\n") == {}


def test_bytes_input_and_bom():
    assert parse_pbtxt('\ufeffname: "m"'.encode("utf-8")) == {"name": "m"}


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "source, line, column, fragment",
    [
        ("a {\n  b: 1\n", 1, 3, "missing '}'"),
        ("a <\n  b: 1 }", 2, 8, "expected '>'"),
        ("}", 1, 1, "expected a field name"),
        ("a: 1\nb 5", 2, 3, "expected ':' or '{'"),
        ("a:", 1, 3, "got end of input"),
        ("a {\n b: }", 2, 5, "expected a value, got '}'"),
        ("a: 1.2.3", 1, 4, "invalid number"),
        ("a: 12abc", 1, 4, "invalid number"),
        ("a: 09", 1, 4, "invalid octal"),
        ('a: "abc', 1, 4, "unterminated string"),
        ('a: "ab\ncd"', 1, 4, "unterminated string"),
        ('x: 1\n  a: "ok \\q"', 2, 10, "unknown escape"),
        (r'a: "\ud800"', 1, 5, "invalid unicode escape"),
        (r'a: "\xff"', 1, 4, "do not form valid UTF-8"),
        ("a: [1 2]", 1, 7, "expected ',' or ']'"),
        ("a: [1,,2]", 1, 7, "expected a value, got ','"),
        ("a: [1", 1, 4, "missing ']'"),
        ('a: -"x"', 1, 5, "expected a number after '-'"),
        ("a: -TYPE_FP32", 1, 5, "expected a number after '-'"),
        ("a: @", 1, 4, "unexpected character '@'"),
        ("[ext.field]: 1", 1, 1, "extension"),
        ('parameters { key: "x" }', 1, 1, "key: ... value: ..."),
        ("parameters: 5", 1, 1, "key: ... value: ..."),
        ('parameters { key { a: 1 } value: "v" }', 1, 1, "not a scalar"),
    ],
)
def test_errors_carry_line_and_column(source, line, column, fragment):
    with pytest.raises(PbtxtError, match=fragment) as info:
        parse_pbtxt(source)
    assert (info.value.line, info.value.column) == (line, column)
    assert str(info.value).startswith(f"line {line}, column {column}: ")
    assert isinstance(info.value, ValueError)


def test_deep_nesting_is_an_error_not_a_crash():
    with pytest.raises(PbtxtError, match="nested too deeply"):
        parse_pbtxt("a { " * 5000 + "}" * 5000)
    assert parse_pbtxt("a { " * 20 + "}" * 20)["a"]


def test_invalid_utf8_bytes_are_located():
    with pytest.raises(PbtxtError, match="UTF-8") as info:
        parse_pbtxt(b'a: 1\nb: "x\xff"')
    assert (info.value.line, info.value.column) == (2, 6)


@pytest.mark.parametrize("source", ["v: " + "9" * 5000, "v: -" + "1" * 4500, "dims: [ 1, " + "7" * 4400 + " ]"])
def test_a_number_too_long_to_convert_is_a_parse_error(source):
    """Python refuses to convert a decimal of more than 4300 digits (ValueError): a PbtxtError with its place."""
    with pytest.raises(PbtxtError, match=r"line 1, column \d+: number too long"):
        parse_pbtxt(source)
