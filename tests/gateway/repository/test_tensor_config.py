"""Tensor model configuration: config.pbtxt and config.yaml land on one typed config; unsupported or misspelled
fields fail at load with the file and the field named."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import ConfigError
from gateway.repository.model_config import ModelConfig, parse_model_config
from gateway.repository.tensor_config import TensorModelConfig, VersionPolicy, is_tensor_config

FULL_PBTXT = """
name: "resnet"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ { name: "INPUT__0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, -1, -1 ] },
        { name: "MASK" data_type: TYPE_BOOL dims: [ 1 ] optional: true reshape: { shape: [ ] } } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1000 ] } ]
instance_group [ { count: 2 kind: KIND_CPU }, { count: 1 kind: KIND_GPU } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  preserve_ordering: true
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000 allow_timeout_override: true max_queue_size: 32 }
  priority_queue_policy { key: 2 value: { timeout_action: REJECT max_queue_size: 4 } }
}
version_policy: { latest { num_versions: 2 } }
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
model_warmup [ { name: "zeros" batch_size: 2 inputs { key: "INPUT__0" value: { data_type: TYPE_FP32 dims: [ 3, 8, 8 ] zero_data: true } } } ]
model_transaction_policy { decoupled: false }
"""

SAME_YAML = """
platform: onnxruntime_onnx
max_batch_size: 16
input:
  - {name: INPUT__0, data_type: FP32, format: FORMAT_NCHW, dims: [3, -1, -1]}
  - {name: MASK, data_type: TYPE_BOOL, dims: [1], optional: true, reshape: {shape: []}}
output:
  - {name: OUTPUT__0, data_type: fp32, dims: [1000]}
instance_group: [{count: 2, kind: KIND_CPU}, {count: 1, kind: KIND_GPU}]
dynamic_batching:
  preferred_batch_size: [4, 8]
  max_queue_delay_microseconds: 100
  preserve_ordering: true
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy: {timeout_action: DELAY, default_timeout_microseconds: 5000, allow_timeout_override: true, max_queue_size: 32}
  priority_queue_policy: {2: {timeout_action: REJECT, max_queue_size: 4}}
version_policy: {latest: {num_versions: 2}}
parameters: {intra_op_thread_count: 2}
model_warmup:
  - {name: zeros, batch_size: 2, inputs: {INPUT__0: {data_type: TYPE_FP32, dims: [3, 8, 8], zero_data: true}}}
model_transaction_policy: {decoupled: false}
"""


def write(tmp_path: Path, folder: str, filename: str, text: str) -> Path:
    path = tmp_path / folder / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_pbtxt_and_yaml_mean_the_same(tmp_path: Path) -> None:
    from_pbtxt = parse_model_config(write(tmp_path, "resnet", "config.pbtxt", FULL_PBTXT), "resnet")
    from_yaml = parse_model_config(write(tmp_path, "other", "config.yaml", SAME_YAML), "resnet")
    assert isinstance(from_pbtxt, TensorModelConfig)
    assert from_pbtxt.model_copy(update={"name": None}) == from_yaml
    c = from_pbtxt
    assert c.resolved_backend == "onnxruntime" and c.max_batch_size == 16 and c.instance_count == 3
    assert c.input[0].data_type == "FP32" and c.input[0].dims == [3, -1, -1] and c.input[1].optional
    assert c.input[1].reshape is not None and c.input[1].reshape.shape == []
    dyn = c.dynamic_batching
    assert dyn is not None and dyn.preferred_batch_size == [4, 8] and dyn.default_queue_policy.timeout_action == "DELAY"
    assert dyn.priority_queue_policy[2].max_queue_size == 4
    assert c.parameters == {"intra_op_thread_count": "2"}
    assert c.model_warmup[0].inputs["INPUT__0"].dims == [3, 8, 8]
    assert c.version_policy.select((1, 2, 3)) == [2, 3]


def test_sequence_and_ensemble_sections(tmp_path: Path) -> None:
    seq = parse_model_config(
        write(
            tmp_path,
            "acc",
            "config.pbtxt",
            """
        backend: "python" max_batch_size: 4
        input { name: "IN" data_type: TYPE_INT32 dims: 1 }
        output { name: "OUT" data_type: TYPE_INT32 dims: 1 }
        sequence_batching {
          max_sequence_idle_microseconds: 2000000
          control_input [
            { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
            { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ]
          oldest { max_candidate_sequences: 4 }
          state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
                    initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } } ]
        }""",
        ),
        "acc",
    )
    assert isinstance(seq, TensorModelConfig) and seq.sequence_batching is not None
    assert seq.sequence_batching.control_input[1].control[0].data_type == "UINT64"
    assert seq.sequence_batching.oldest is not None and seq.sequence_batching.state[0].initial_state[0].zero_data
    ens = parse_model_config(
        write(
            tmp_path,
            "pipe",
            "config.pbtxt",
            """
        platform: "ensemble" max_batch_size: 8
        input { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }
        output { name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] }
        ensemble_scheduling { step [
          { model_name: "pre" model_version: -1 input_map { key: "RAW" value: "TEXT" } output_map { key: "FEATS" value: "f" } },
          { model_name: "post" model_version: 1 input_map { key: "F" value: "f" } output_map { key: "OUT" value: "LABEL" } } ] }""",
        ),
        "pipe",
    )
    assert isinstance(ens, TensorModelConfig) and ens.resolved_backend == "ensemble"
    assert ens.ensemble_scheduling is not None and ens.ensemble_scheduling.step[0].input_map == {"RAW": "TEXT"}


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        ('backend: "python" optimization { cuda { graphs: true } }', "(top level)", "'optimization'"),
        (
            'backend: "python" input { name: "A" data_type: TYPE_FP32 dims: 1 allow_ragged_batch: true }',
            "input.0.allow_ragged_batch",
            "ragged",
        ),
        (
            'backend: "python" output { name: "A" data_type: TYPE_FP32 dims: 1 label_filename: "l.txt" }',
            "output.0.label_filename",
            "classification",
        ),
        ('backend: "python" instance_group { count: 1 gpus: [ 0 ] }', "instance_group.0.gpus", "GPU"),
        ('backend: "python" response_cache { enable: true }', "response_cache.enable", "response cache"),
        ('platform: "tensorrt_plan"', "(top level)", "tensorrt_plan"),
        ('backend: "openvino" max_batch_size: 1', "(top level)", "not a tensor backend"),
        ('backend: "python" input { name: "A" data_type: TYPE_FP33 dims: 1 }', "input.0.data_type", "TYPE_FP33"),
        ('backend: "python" input { name: "A" data_type: TYPE_FP32 dims: 0 }', "input.0.dims", "dims"),
        (
            'backend: "python" max_batch_size: 2 dynamic_batching { preferred_batch_size: 4 }',
            "(top level)",
            "max_batch_size",
        ),
        (
            'backend: "python" dynamic_batching { priority_levels: 2 default_priority_level: 3 }',
            "dynamic_batching",
            "default_priority_level",
        ),
        ('backend: "python" max_batch_sise: 4', "max_batch_sise", "remove it or check its spelling"),
        ('backend: "python" version_policy { latest { num_versions: 1 } all { } }', "version_policy", "one of"),
        ('backend: "python" dynamic_batching { } sequence_batching { }', "(top level)", "only one"),
        (
            'backend: "python" sequence_batching { control_input { name: "S" control { kind: CONTROL_SEQUENCE_START } } }',
            "sequence_batching.control_input.0.control.0",
            "false_true",
        ),
        (
            'backend: "python" input { name: "A" data_type: TYPE_FP32 dims: 1 } input { name: "A" data_type: TYPE_FP32 dims: 1 }',
            "(top level)",
            "unique",
        ),
    ],
)
def test_unsupported_and_wrong_fields_name_file_and_field(tmp_path: Path, text: str, field: str, fragment: str) -> None:
    path = write(tmp_path, "m", "config.pbtxt", text)
    with pytest.raises(ConfigError) as err:
        parse_model_config(path, "m")
    message = str(err.value)
    assert str(path) in message and f"field '{field}'" in message and fragment in message, message


def test_pbtxt_syntax_error_is_located(tmp_path: Path) -> None:
    path = write(tmp_path, "m", "config.pbtxt", 'backend: "python"\ninput { name: "A" ')
    with pytest.raises(ConfigError, match=r"config.pbtxt: not valid protobuf text format \(line 2"):
        parse_model_config(path, "m")


def test_name_must_match_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="folder is 'm'"):
        parse_model_config(write(tmp_path, "m", "config.pbtxt", 'name: "other" backend: "python"'), "m")


def test_yaml_detection_keeps_llm_configs_llm(tmp_path: Path) -> None:
    llm = parse_model_config(write(tmp_path, "llm", "config.yaml", "backend: pytorch\nmodel: weights.gguf\n"), "llm")
    assert isinstance(llm, ModelConfig)
    torchscript = parse_model_config(
        write(tmp_path, "ts", "config.yaml", "backend: pytorch\nmax_batch_size: 4\n"), "ts"
    )
    assert isinstance(torchscript, TensorModelConfig) and torchscript.resolved_backend == "pytorch"
    assert is_tensor_config({"backend": "python"}) and is_tensor_config({"backend": "transformers"})
    assert not is_tensor_config({"backend": "vllm", "model": "x"})


@pytest.mark.parametrize(
    ("policy", "available", "expected"),
    [
        ({}, (1, 2, 3), [3]),
        ({"latest": {"num_versions": 2}}, (1, 2, 3), [2, 3]),
        ({"latest": {"num_versions": 5}}, (1, 3), [1, 3]),
        ({"all": {}}, (1, 2, 3), [1, 2, 3]),
        ({"specific": {"versions": [1, 3, 7]}}, (1, 2, 3), [1, 3]),
        ({}, (), []),
    ],
)
def test_version_policy(policy: dict, available: tuple[int, ...], expected: list[int]) -> None:
    assert VersionPolicy.model_validate(policy).select(available) == expected


def test_parameters_are_strings_either_way() -> None:
    yaml_style = TensorModelConfig.model_validate({"backend": "python", "parameters": {"a": 1, "b": True, "c": "x"}})
    pbtxt_style = TensorModelConfig.model_validate(
        {
            "backend": "python",
            "parameters": {"a": {"string_value": "1"}, "b": {"string_value": "true"}, "c": {"string_value": "x"}},
        }
    )
    assert yaml_style.parameters == pbtxt_style.parameters == {"a": "1", "b": "true", "c": "x"}
