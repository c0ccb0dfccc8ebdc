"""Request models for /v1, with OpenAI's ranges.

Unknown fields are accepted and kept in `model_extra` (clients send OpenAI-only fields such as `store`); the
router logs them. NaN and infinities are refused. vLLM's extra sampling fields are accepted too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.errors import InvalidRequestError

MAX_STOP_SEQUENCES = 64
MAX_STOP_LENGTH = 1024
MAX_TOOLS = 128
MAX_PATTERN_CHARS = 4096
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for function and response_format names


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class StreamOptions(_Lenient):
    include_usage: bool = False


class JsonSchemaFormat(_Lenient):
    name: str = Field("response", pattern=NAME_PATTERN)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_present(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError("type json_schema needs json_schema.schema")
        return self


class StructuredOutputs(_Lenient):
    """vLLM's `structured_outputs` (and its older top-level `guided_*` fields): exactly one constraint."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = Field(None, min_length=1, max_length=MAX_PATTERN_CHARS)
    choice: list[Annotated[str, Field(min_length=1, max_length=MAX_PATTERN_CHARS)]] | None = Field(
        None, min_length=1, max_length=256
    )
    grammar: str | None = Field(None, min_length=1, max_length=64 * 1024)  # Lark, llguidance's dialect
    json_object: bool | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        keys = ("json_", "regex", "choice", "grammar", "json_object")
        given = [k for k in keys if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError("set exactly one of json, regex, choice, grammar, json_object")
        return self


class FunctionDefinition(_Lenient):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Lenient):
    name: str = Field(max_length=64)


class NamedToolChoice(_Lenient):
    type: Literal["function"] = "function"
    function: NamedFunction


class FunctionCall(_Lenient):
    name: str = Field(max_length=64)
    arguments: str | dict[str, Any] = ""  # OpenAI sends a JSON string; some clients send the object


class ToolCall(_Lenient):
    id: str = Field("", max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class SamplingFields(_Lenient):
    """Fields shared by chat and completions."""

    model: str = Field(min_length=1, max_length=256)
    n: int = Field(1, ge=1, le=128)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM extras
    top_k: int | None = Field(None, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=2.0)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = Field(None, max_length=MAX_STOP_SEQUENCES)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    priority: int = 0
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    # vLLM's older spellings of structured_outputs
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = Field(None, min_length=1, max_length=MAX_PATTERN_CHARS)
    guided_choice: list[str] | None = Field(None, min_length=1, max_length=256)
    guided_grammar: str | None = Field(None, min_length=1, max_length=64 * 1024)
    # Routes a conversation's turns to the same KV session; the X-Session-ID header wins over this field.
    session_id: str | None = Field(None, min_length=1, max_length=256)
    # Longest wait for admission in seconds (gateway/http/request_timeout.py); X-Request-Timeout wins over it.
    timeout: float | None = Field(None, gt=0, le=3600)

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, value: str | list[str] | None) -> list[str] | None:
        stops = [value] if isinstance(value, str) else value
        if stops is None:
            return None
        if len(stops) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed")
        if any(len(s) > MAX_STOP_LENGTH or not s for s in stops):
            raise ValueError(f"each stop sequence must be 1 to {MAX_STOP_LENGTH} characters")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        if len(value) > 1024:
            raise ValueError("at most 1024 logit_bias entries are allowed")
        for key, bias in value.items():
            digits = key.removeprefix("-")
            if not (digits.isascii() and digits.isdigit() and len(digits) <= 12):  # int() refuses > 4300 digits
                raise ValueError(f"logit_bias keys must be token ids (integers), got '{key[:32]}'")
            if not -100.0 <= bias <= 100.0:
                raise ValueError("logit_bias values must be between -100 and 100")
        return value

    def check(self) -> None:
        """Rules across fields. Not pydantic validators: an error on the whole body could not name a `param`."""
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError("stream_options is only allowed when stream is true", param="stream_options")
        legacy = {
            "json": self.guided_json,
            "regex": self.guided_regex,
            "choice": self.guided_choice,
            "grammar": self.guided_grammar,
        }
        legacy = {k: v for k, v in legacy.items() if v is not None}
        if legacy:
            if self.structured_outputs is not None:
                raise InvalidRequestError(
                    "use structured_outputs or the guided_* fields, not both", param="structured_outputs"
                )
            if len(legacy) > 1:
                raise InvalidRequestError("set one guided_* field", param=f"guided_{sorted(legacy)[0]}")
            self.structured_outputs = StructuredOutputs.model_validate(legacy)
        if self.structured_outputs is not None and self.response_format is not None:
            if self.response_format.type != "text":
                raise InvalidRequestError(
                    "use response_format or structured_outputs, not both", param="structured_outputs"
                )


class ContentPart(_Lenient):
    type: str
    text: str | None = None


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = Field(None, max_length=MAX_TOOLS)
    tool_call_id: str | None = Field(None, max_length=256)


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ToolDefinition] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    def check(self) -> None:
        super().check()
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError("top_logprobs requires logprobs to be true", param="top_logprobs")


PromptType = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(SamplingFields):
    prompt: PromptType
    max_tokens: int | None = Field(16, ge=1)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=128)
