"""Typed configuration of a tensor (KServe v2) model, with Triton's `ModelConfig` field names.

`config.yaml` and Triton's `config.pbtxt` (read by `pbtxt.py`) both land here, so a Triton repository and a
Switchyard one mean the same thing. Every field Triton defines is either supported or refused by name at load
time (never ignored silently); unknown fields are typos and refused too. Datatypes are accepted as Triton's
`TYPE_FP32` or the wire name `FP32` and stored as the wire name.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.repository.lifecycle_config import LifecycleFields

#: Triton DataType enum name -> KServe wire datatype.
TRITON_DATATYPES = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
    "TYPE_BF16": "BF16",
}
WIRE_DATATYPES = frozenset(TRITON_DATATYPES.values())
#: Backends a tensor model may name (Triton's `backend` values), and Triton platforms mapped onto them.
TENSOR_BACKENDS = ("python", "onnxruntime", "pytorch", "transformers", "tensorflow", "fil", "ensemble")
PLATFORMS = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorflow_savedmodel": "tensorflow",
    "ensemble": "ensemble",
}
#: Triton fields Switchyard does not implement: refused by name when set to anything but an empty value.
UNSUPPORTED = {
    "optimization": "CUDA/TensorRT optimisation settings",
    "batch_input": "batch inputs (ragged batching)",
    "batch_output": "batch outputs (ragged batching)",
    "cc_model_filenames": "per-GPU model files",
    "metric_tags": "metric tags",
    "model_operations": "custom operation libraries",
    "model_repository_agents": "repository agents",
    "runtime": "custom backend runtimes",
}


def wire_datatype(value: Any) -> str:
    """`TYPE_FP32`, `FP32` or `fp32` -> `FP32`; `TYPE_STRING`/`STRING` -> `BYTES`."""
    if not isinstance(value, str):
        raise ValueError("must be a datatype name such as TYPE_FP32 or FP32")
    name = value.upper()
    if name in TRITON_DATATYPES:
        return TRITON_DATATYPES[name]
    if name == "STRING":
        return "BYTES"
    if name in WIRE_DATATYPES:
        return name
    raise ValueError(f"unknown datatype {value!r}; use one of {', '.join(sorted(TRITON_DATATYPES))}")


def triton_datatype(wire: str) -> str:
    """`FP32` -> `TYPE_FP32`, `BYTES` -> `TYPE_STRING` (for Triton-shaped config output)."""
    return "TYPE_STRING" if wire == "BYTES" else f"TYPE_{wire}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _not_set(field: str, why: str):  # noqa: ANN202 - returns a validator
    def check(cls: type, value: Any) -> Any:
        if value:
            raise ValueError(f"'{field}' ({why}) is not supported by Switchyard; remove it")
        return value

    return field_validator(field)(classmethod(check))


class Reshape(_Strict):
    shape: list[int] = Field(default_factory=list, description="Shape the backend sees instead of `dims`.")


class _Tensor(_Strict):
    name: str = Field(min_length=1, max_length=256)
    data_type: str = Field(description="TYPE_FP32 / FP32 / TYPE_STRING (BYTES) ...")
    dims: list[int] = Field(default_factory=list, description="Shape without the batch dimension; -1 = variable.")
    reshape: Reshape | None = None
    is_shape_tensor: bool = False

    _dt = field_validator("data_type", mode="before")(classmethod(lambda cls, v: wire_datatype(v)))
    _shape = _not_set("is_shape_tensor", "shape tensors")

    @field_validator("dims", mode="before")
    @classmethod
    def _dims(cls, value: Any) -> Any:
        value = [value] if isinstance(value, int) else value
        if isinstance(value, list) and any(type(d) is not int or d == 0 or d < -1 for d in value):
            raise ValueError("dims must be positive integers or -1 (variable)")
        return value


class InputConfig(_Tensor):
    optional: bool = Field(False, description="The request may omit this input.")
    format: Literal["FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW"] = "FORMAT_NONE"
    allow_ragged_batch: bool = False

    _ragged = _not_set("allow_ragged_batch", "ragged batching")


class OutputConfig(_Tensor):
    label_filename: str | None = None

    _labels = _not_set("label_filename", "the classification extension")


class QueuePolicy(_Strict):
    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_microseconds: int = Field(0, ge=0, description="0 = no timeout.")
    allow_timeout_override: bool = Field(False, description="Requests may set their own `timeout` parameter.")
    max_queue_size: int = Field(0, ge=0, description="Queued requests beyond this are rejected; 0 = unbounded.")


class DynamicBatching(_Strict):
    preferred_batch_size: list[int] = Field(default_factory=list)
    max_queue_delay_microseconds: int = Field(0, ge=0, description="How long to wait for a batch to fill.")
    preserve_ordering: bool = Field(False, description="Responses leave in the order requests arrived.")
    priority_levels: int = Field(0, ge=0, description="Levels 1 (highest) .. N; 0 = no priorities.")
    default_priority_level: int = Field(0, ge=0)
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policy: dict[int, QueuePolicy] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _levels(self) -> DynamicBatching:
        if any(p < 1 for p in self.preferred_batch_size):
            raise ValueError("preferred_batch_size entries must be positive")
        levels = self.priority_levels
        if levels and not 1 <= self.default_priority_level <= levels:
            raise ValueError(f"default_priority_level must be between 1 and priority_levels ({levels})")
        if not levels and self.default_priority_level:
            raise ValueError("default_priority_level needs priority_levels")
        bad = [k for k in self.priority_queue_policy if not 1 <= k <= levels]
        if bad:
            raise ValueError(f"priority_queue_policy levels {bad} are outside 1..priority_levels ({levels})")
        return self


class Control(_Strict):
    kind: Literal["CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_READY", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_CORRID"]
    int32_false_true: list[int] = Field(default_factory=list)
    fp32_false_true: list[float] = Field(default_factory=list)
    bool_false_true: list[bool] = Field(default_factory=list)
    data_type: str | None = None

    @field_validator("data_type", mode="before")
    @classmethod
    def _dt(cls, value: Any) -> Any:
        return None if value is None else wire_datatype(value)

    @model_validator(mode="after")
    def _values(self) -> Control:
        given = [v for v in (self.int32_false_true, self.fp32_false_true, self.bool_false_true) if v]
        if self.kind == "CONTROL_SEQUENCE_CORRID":
            if self.data_type not in ("UINT64", "INT64", "UINT32", "INT32", "BYTES"):
                raise ValueError(
                    "a CORRID control needs data_type TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING"
                )
        elif len(given) != 1 or len(given[0]) != 2:
            raise ValueError(
                f"{self.kind} needs exactly one of int32_false_true / fp32_false_true / "
                "bool_false_true with two values [false, true]"
            )
        return self


class ControlInput(_Strict):
    name: str = Field(min_length=1)
    control: list[Control] = Field(min_length=1)


class InitialState(_Strict):
    name: str = ""
    data_type: str
    dims: list[int] = Field(default_factory=list)
    zero_data: bool = False
    data_file: str | None = None

    _dt = field_validator("data_type", mode="before")(classmethod(lambda cls, v: wire_datatype(v)))
    _file = _not_set("data_file", "initial state from a file")


class SequenceState(_Strict):
    input_name: str = Field(min_length=1)
    output_name: str = Field(min_length=1)
    data_type: str
    dims: list[int] = Field(default_factory=list)
    initial_state: list[InitialState] = Field(default_factory=list)
    use_same_buffer_for_input_output: bool = False
    use_growable_memory: bool = False

    _dt = field_validator("data_type", mode="before")(classmethod(lambda cls, v: wire_datatype(v)))


class StrategyDirect(_Strict):
    max_queue_delay_microseconds: int = Field(0, ge=0)
    minimum_slot_utilization: float = Field(0.0, ge=0.0, le=1.0)


class StrategyOldest(_Strict):
    max_candidate_sequences: int = Field(0, ge=0)
    preferred_batch_size: list[int] = Field(default_factory=list)
    max_queue_delay_microseconds: int = Field(0, ge=0)
    preserve_ordering: bool = False


class SequenceBatching(_Strict):
    max_sequence_idle_microseconds: int = Field(1_000_000, ge=1, description="Idle sequences are released after this.")
    control_input: list[ControlInput] = Field(default_factory=list)
    direct: StrategyDirect | None = None
    oldest: StrategyOldest | None = None
    state: list[SequenceState] = Field(default_factory=list)
    iterative_sequence: bool = False

    _iterative = _not_set("iterative_sequence", "iterative sequences")

    @model_validator(mode="after")
    def _one_strategy(self) -> SequenceBatching:
        if self.direct is not None and self.oldest is not None:
            raise ValueError("set either 'direct' or 'oldest', not both")
        return self


class EnsembleStep(_Strict):
    model_name: str = Field(min_length=1)
    model_version: int = Field(-1, ge=-1, description="-1 = the latest loaded version.")
    input_map: dict[str, str] = Field(default_factory=dict, description="step model input -> ensemble tensor")
    output_map: dict[str, str] = Field(default_factory=dict, description="step model output -> ensemble tensor")
    model_namespace: str = ""

    _ns = _not_set("model_namespace", "model namespaces")


class EnsembleScheduling(_Strict):
    step: list[EnsembleStep] = Field(min_length=1)


class RateLimiterResource(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(min_length=1, max_length=256)
    is_global: bool = Field(False, alias="global", description="One pool for the server instead of one per device.")
    count: int = Field(0, ge=0, description="Copies of the resource the instance holds while it executes.")


class RateLimiterConfig(_Strict):
    resources: list[RateLimiterResource] = Field(default_factory=list)
    priority: int = Field(0, ge=0, description="Weight under contention: 2 gets half the turns of 1 (0 counts as 1).")

    @field_validator("resources")
    @classmethod
    def _unique(cls, value: list[RateLimiterResource]) -> list[RateLimiterResource]:
        names = [r.name for r in value]
        if len(names) != len(set(names)):
            raise ValueError("rate_limiter resource names must be unique within an instance group")
        return value


class InstanceGroup(_Strict):
    name: str = ""
    count: int = Field(1, ge=1, le=64, description="Model instances executing batches concurrently.")
    kind: Literal["KIND_AUTO", "KIND_CPU", "KIND_GPU", "KIND_MODEL"] = "KIND_AUTO"
    gpus: list[int] = Field(default_factory=list)
    profile: list[str] = Field(default_factory=list)
    passive: bool = False
    host_policy: str = ""
    rate_limiter: RateLimiterConfig | None = Field(None, description="Resources and priority (--rate-limit).")
    secondary_devices: list[Any] = Field(default_factory=list)

    _gpus = _not_set("gpus", "GPU placement; instances run on the CPU")
    _profile = _not_set("profile", "TensorRT profiles")
    _passive = _not_set("passive", "passive instances")
    _host = _not_set("host_policy", "host policies")
    _secondary = _not_set("secondary_devices", "secondary devices")


class VersionPolicy(_Strict):
    latest: dict[str, int] | None = None
    all: dict[str, Any] | None = None
    specific: dict[str, list[int]] | None = None

    @model_validator(mode="after")
    def _one(self) -> VersionPolicy:
        chosen = [k for k in ("latest", "all", "specific") if getattr(self, k) is not None]
        if len(chosen) > 1:
            raise ValueError("choose one of latest / all / specific")
        if self.latest is not None and (set(self.latest) - {"num_versions"} or self.latest.get("num_versions", 1) < 1):
            raise ValueError("latest takes { num_versions: N } with N >= 1")
        if self.specific is not None and (set(self.specific) != {"versions"} or not self.specific["versions"]):
            raise ValueError("specific takes { versions: [1, 3] }")
        if self.all:
            raise ValueError("all takes no fields: all: {}")
        return self

    def select(self, available: tuple[int, ...]) -> list[int]:
        """The versions to serve out of the version folders present (Triton's default: the latest one)."""
        if self.all is not None:
            return list(available)
        if self.specific is not None:
            return [v for v in available if v in self.specific["versions"]]
        n = (self.latest or {}).get("num_versions", 1)
        return list(available[-n:]) if available else []


class WarmupInput(_Strict):
    data_type: str
    dims: list[int] = Field(default_factory=list)
    zero_data: bool = False
    random_data: bool = False
    input_data_file: str | None = None

    _dt = field_validator("data_type", mode="before")(classmethod(lambda cls, v: wire_datatype(v)))

    @model_validator(mode="after")
    def _one(self) -> WarmupInput:
        if sum([self.zero_data, self.random_data, self.input_data_file is not None]) != 1:
            raise ValueError("set exactly one of zero_data, random_data, input_data_file")
        if any(d < 1 for d in self.dims):
            raise ValueError("warmup dims must be positive")
        return self


class ModelWarmup(_Strict):
    name: str = Field(min_length=1)
    batch_size: int = Field(1, ge=0)
    inputs: dict[str, WarmupInput] = Field(default_factory=dict)
    count: int = Field(1, ge=0, le=1000)


class TransactionPolicy(_Strict):
    decoupled: bool = Field(False, description="The model sends zero or more responses per request (streaming).")


class ResponseCache(_Strict):
    enable: bool = False

    _enable = _not_set("enable", "the response cache")


class TensorSource(_Strict):
    """Switchyard extension: weights outside the version folder (`package://pkg/dir` or a path in the model folder)."""

    source: str = ""


class TensorModelConfig(_Strict, LifecycleFields):
    """A tensor model (Triton `ModelConfig` names). Exactly one of dynamic / sequence / ensemble scheduling."""

    name: str | None = None
    platform: str = ""
    backend: str = ""
    max_batch_size: int = Field(0, ge=0, le=1 << 20, description="0 = no batch dimension; N > 0 adds one.")
    input: list[InputConfig] = Field(default_factory=list)
    output: list[OutputConfig] = Field(default_factory=list)
    dynamic_batching: DynamicBatching | None = None
    sequence_batching: SequenceBatching | None = None
    ensemble_scheduling: EnsembleScheduling | None = None
    instance_group: list[InstanceGroup] = Field(default_factory=list)
    version_policy: VersionPolicy = VersionPolicy()
    default_model_filename: str = ""
    parameters: dict[str, str] = Field(default_factory=dict, description="Backend-specific settings.")
    model_warmup: list[ModelWarmup] = Field(default_factory=list)
    model_transaction_policy: TransactionPolicy = TransactionPolicy()
    response_cache: ResponseCache = ResponseCache()
    # Switchyard extensions.
    model: TensorSource = TensorSource()
    owned_by: str = "switchyard"
    cpu_threads: int | None = Field(
        None,
        ge=1,
        le=256,
        description="Backends transformers and pytorch: the model's share of the CPU, the torch threads each "
        "instance runs its batches on. Default: the CPU budget (docs/cpu.md#threads-per-model).",
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        out = dict(raw)
        for key, why in UNSUPPORTED.items():
            if key in out:
                if out[key] in (None, {}, [], ""):
                    del out[key]
                else:
                    raise ValueError(f"'{key}' ({why}) is a Triton setting Switchyard does not support; remove it")
        return out

    @field_validator("model", mode="before")
    @classmethod
    def _source_shorthand(cls, value: Any) -> Any:
        return {"source": value} if isinstance(value, str) else value

    @field_validator("parameters", mode="before")
    @classmethod
    def _parameters(cls, value: Any) -> Any:
        """Triton writes `{ key: "k" value: { string_value: "v" } }`; YAML may give plain scalars."""
        if not isinstance(value, dict):
            return value
        out = {}
        for key, item in value.items():
            if isinstance(item, dict):
                if set(item) != {"string_value"}:
                    raise ValueError(f"parameter {key!r} must be a scalar or {{string_value: ...}}")
                item = item["string_value"]
            if isinstance(item, bool):
                item = str(item).lower()
            if not isinstance(item, (str, int, float)):
                raise ValueError(f"parameter {key!r} must be a string or number")
            out[str(key)] = str(item)
        return out

    @model_validator(mode="after")
    def _consistent(self) -> TensorModelConfig:
        backend = self.resolved_backend  # raises on an unknown backend/platform
        schedulers = [s for s in (self.dynamic_batching, self.sequence_batching, self.ensemble_scheduling) if s]
        if len(schedulers) > 1:
            raise ValueError("set only one of dynamic_batching, sequence_batching, ensemble_scheduling")
        if (backend == "ensemble") != (self.ensemble_scheduling is not None):
            raise ValueError("an ensemble needs platform 'ensemble' and ensemble_scheduling, both")
        for kind, tensors in (("input", self.input), ("output", self.output)):
            names = [t.name for t in tensors]
            if len(names) != len(set(names)):
                raise ValueError(f"{kind} names must be unique")
        batching = self.dynamic_batching
        if batching and batching.preferred_batch_size and max(batching.preferred_batch_size) > self.max_batch_size:
            raise ValueError("dynamic_batching.preferred_batch_size entries must not exceed max_batch_size")
        if self.sequence_batching and self.model_transaction_policy.decoupled:
            raise ValueError("decoupled sequence models are not supported")
        return self

    @property
    def resolved_backend(self) -> str:
        """The backend to run, from `backend` or Triton's `platform`."""
        platform = self.platform
        if platform and platform not in PLATFORMS:
            raise ValueError(
                f"platform {platform!r} is not supported; use one of {', '.join(PLATFORMS)} "
                f"or a backend ({', '.join(TENSOR_BACKENDS)})"
            )
        from_platform = PLATFORMS.get(platform, "")
        backend = self.backend or from_platform
        if self.backend and from_platform and self.backend != from_platform:
            raise ValueError(f"backend {self.backend!r} and platform {platform!r} disagree; keep one")
        if backend not in TENSOR_BACKENDS:
            raise ValueError(f"backend {backend!r} is not a tensor backend; use one of {', '.join(TENSOR_BACKENDS)}")
        return backend

    @property
    def instance_count(self) -> int:
        return sum(g.count for g in self.instance_group) if self.instance_group else 1

    @property
    def decoupled(self) -> bool:
        return self.model_transaction_policy.decoupled


#: Keys that make a config.yaml a tensor model's config even with `backend: pytorch` (then: TorchScript).
TENSOR_KEYS = frozenset(
    {
        "platform",
        "max_batch_size",
        "input",
        "output",
        "dynamic_batching",
        "sequence_batching",
        "ensemble_scheduling",
        "instance_group",
        "version_policy",
        "model_warmup",
        "default_model_filename",
    }
)


def is_tensor_config(raw: dict[str, Any]) -> bool:
    """Whether a raw config describes a tensor model rather than an LLM."""
    backend = raw.get("backend")
    if isinstance(backend, str) and backend in TENSOR_BACKENDS and backend != "pytorch":
        return True
    return bool(TENSOR_KEYS & set(raw))
