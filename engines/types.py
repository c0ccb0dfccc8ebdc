"""Plain data passed across the gateway/engine boundary.

These are dataclasses, not pydantic models: they are built once per request or per step on the hot path,
and they must stay free of any HTTP concern.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from engines.token_constraint import TokenConstraint

GuidedKind = Literal["json", "regex", "choice", "lark"]

# How guided JSON is written wherever the engine can choose: compact, with Python's `json.dumps` separators, and
# `oneOf` read as `anyOf`. Spelled as llguidance's `x-guidance` options, the form that both the native engine's
# compiler and vLLM's `guidance` structured-output backend read from a schema.
JSON_FORMAT: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "coerce_one_of": True,
}


@dataclass(frozen=True)
class GuidedSpec:
    """What guided decoding must enforce, as plain data any engine can read (the engine-agnostic half of guided
    decoding; `SamplingParams.constraint` is the compiled half, for engines that take a logits mask).

    * `json`   -- `value` is a JSON Schema (dict) the whole output must validate against. The gateway has already
                  checked it and closed its objects (`additionalProperties: false` where the schema said nothing),
                  so engines enforce it as given; `{"type": "object"}` is OpenAI's `json_object`. Output should be
                  formatted as `JSON_FORMAT` says where the engine can choose.
    * `regex`  -- `value` is a regular expression (Rust `regex` syntax) the whole output must match.
    * `choice` -- `value` is a list of strings; the output is exactly one of them.
    * `lark`   -- `value` is a Lark grammar in llguidance's dialect (`%json {...}` embeds a JSON Schema); forced
                  tool calls use it to pin the tool parser's call format.

    These are exactly the constraints of vLLM's `StructuredOutputsParams` (`json`, `regex`, `choice`, `grammar`),
    so an engine can pass them on unchanged.
    """

    kind: GuidedKind
    value: Any
    param: str | None = None  # the request field that asked for it: an engine refusing the spec names it (400)

    def structured_outputs(self) -> dict[str, Any]:
        """The spec as vLLM's `structured_outputs` fields (one of json, regex, choice, grammar)."""
        field_name = {"json": "json", "regex": "regex", "choice": "choice", "lark": "grammar"}.get(self.kind)
        if field_name is None:
            raise ValueError(f"guided decoding of kind '{self.kind}' is not supported")
        return {field_name: list(self.value) if self.kind == "choice" else self.value}


GREEDY_BELOW = 1e-5  # a temperature under this samples greedily


@dataclass
class SamplingParams:
    """How to pick each next token. Defaults mean "plain sampling at temperature 1"."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None  # None = no logprobs; k >= 0 = sampled token's logprob plus k alternatives
    # Guided decoding (JSON schema, grammar, forced tool call). `guided` describes it and is always set when a
    # request asks for it; `constraint` is that description compiled into a per-sequence logits mask, set only for
    # engines that apply masks (see `AsyncGenerateEngine.enforces_guided_spec`). Stateful: one per sequence.
    guided: GuidedSpec | None = None
    constraint: TokenConstraint | None = None

    @property
    def greedy(self) -> bool:
        """Temperatures below 1e-5 are greedy (vLLM's convention): dividing logits by less overflows them."""
        return self.temperature < GREEDY_BELOW


@dataclass(frozen=True)
class AdapterRef:
    """A LoRA adapter a request runs under (vLLM's `LoRARequest`: lora_name, lora_int_id, lora_path).

    `id` is unique per load in this process (1, 2, ...; 0 is the base model): an adapter unloaded and loaded again
    under its name is another id, so KV blocks computed under the old weights are never found for the new ones."""

    name: str
    id: int
    path: str


@dataclass
class GenerationRequest:
    """One sequence to generate. `n>1` is fanned out by the gateway into several of these."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    priority: int = 0  # lower value = served first (vLLM's convention)
    session_id: str | None = None
    arrival_time: float = 0.0
    trace_headers: dict[str, str] = field(default_factory=dict)  # W3C traceparent/tracestate to pass downstream
    # longest wait for admission in seconds (the client's `timeout`); None: the model's default_timeout_seconds
    queue_timeout: float | None = None
    adapter: AdapterRef | None = None  # the LoRA adapter it runs under; None: the base model


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class GenerationOutput:
    """An incremental update for one request: the tokens and text produced since the previous update."""

    request_id: str
    new_token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    error: str | None = None


@dataclass
class SequenceStep:
    """One sequence's share of a model step.

    The engine appends `token_ids` to the KV cache at positions `[start_pos, start_pos + len(token_ids))`,
    using `block_table` (block ids from the scheduler's KV manager) to find the slots. When `sample` is true it
    samples the next token from the last position's logits; a non-final chunk of a chunked prefill does not sample.
    `history` is every token of the sequence so far (prompt + output), needed for penalties.

    Speculative decoding (verification): when `num_draft_tokens` = k > 0, `token_ids` is the sequence's last token
    followed by k proposed tokens that are not in `history`; the engine writes all k + 1 to the cache, computes the
    logits at every one of those positions, each exactly as a one-token decode step would, and accepts a prefix of
    the proposal (`StepResult.num_accepted`) by the rule of `engines/pytorch/sampler.py`.
    """

    seq_id: str
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    sample: bool
    sampling: SamplingParams
    history: list[int]
    num_prompt_tokens: int
    num_output_tokens: int
    num_draft_tokens: int = 0
    adapter_id: int = 0  # the LoRA adapter its rows run under (AdapterRef.id); 0: the base model

    @property
    def draft_token_ids(self) -> list[int]:
        """The proposed tokens a verification step checks (empty for any other step)."""
        return self.token_ids[len(self.token_ids) - self.num_draft_tokens :] if self.num_draft_tokens else []


@dataclass
class StepResult:
    """What a model step produced, one entry per sequence that sampled: a token, or (for a row whose own work
    failed: its logits, its sampling, its constraint) the error its request ends with, in words for the client.

    For a verification step (`SequenceStep.num_draft_tokens` > 0), `num_accepted` says how many of the proposed
    tokens were accepted (0..k); the sequence's new tokens are those, then `token_ids`' token (the target model's
    own choice at the first rejected position, or the bonus token after the last proposed one)."""

    token_ids: dict[str, int]
    logprobs: dict[str, TokenLogprob] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    num_accepted: dict[str, int] = field(default_factory=dict)


@dataclass
class EngineInfo:
    """Static facts the gateway needs to schedule and to describe the model."""

    model_type: str
    dtype: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: list[int]
    block_size: int = 16
    num_kv_blocks: int = 0
    kv_bytes_per_token: int = 0
    # Whether a verification step's logits (SequenceStep.num_draft_tokens) are bit for bit those of one-token
    # decode steps: speculative decoding keeps greedy output unchanged only then, and is not used otherwise.
    exact_verification: bool = False
    # The most decode rows (one-token steps' and verification steps' rows) a step may hold for that to stay true; 0:
    # any number (the native engine on a CPU with AMX: past it, decode rows go through the tile unit, other bits).
    max_exact_decode_rows: int = 0
    # Bytes of weights the engine holds in this process (0: not counted, or held elsewhere): with the KV pool's
    # bytes, what the memory budget counts for the model once loaded (gateway/repository/memory_budget.py).
    weight_bytes: int = 0
    # Whether every prefill row's (a chunk of two or more new tokens) keys and values are in the cache before any
    # prefill row of the same step attends, so one row may read blocks another row writes in that step: the
    # scheduler then admits followers of a shared prefix in the step that completes it (step_scheduler.py).
    prefill_reads_step_writes: bool = False


# ---------------------------------------------------------------- tensor (KServe v2) models


@dataclass
class TensorSpec:
    """One input or output of a tensor model, as the backend sees it.

    `datatype` is the KServe wire name (FP32, INT64, BYTES, ...). `dims` exclude the batch dimension; -1 means
    variable. `optional` inputs may be absent from a request.
    """

    name: str
    datatype: str
    dims: list[int]
    optional: bool = False


@dataclass
class TensorModelSpec:
    """Everything a tensor backend needs to load one instance of one model version.

    `model_dir` is the model's folder, `version_dir` the version folder being served (it may not exist for models
    whose weights live elsewhere, e.g. `source`). `source` is a resolved path to weights outside the version folder
    (a `package://` resource), or None. `config` is the model's whole configuration as plain JSON data (Triton's
    field names), for backends that want more than the fields lifted out here.
    """

    name: str
    version: int
    model_dir: str
    version_dir: str
    max_batch_size: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    parameters: dict[str, str] = field(default_factory=dict)
    default_model_filename: str | None = None
    source: str | None = None
    instance_index: int = 0
    decoupled: bool = False
    config: dict[str, Any] = field(default_factory=dict)
