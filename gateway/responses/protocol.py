"""Request models for POST /v1/responses, with OpenAI's shapes and ranges.

Unknown fields are accepted and logged (clients send `reasoning`, `include`, `service_tier`, ...). Input items are
checked by their `type`: messages (text parts), function calls and their outputs; anything the models here cannot
read (images, files, hosted tools) is refused with a 400 that names the item.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, StrictBool, StrictStr, Tag, field_validator

from gateway.openai.protocol import MAX_TOOLS, NAME_PATTERN, _Lenient

MAX_INPUT_ITEMS = 4096
MAX_METADATA_KEYS = 16  # OpenAI's limits on metadata
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
MAX_ID = 256


class TextPart(_Lenient):
    type: Literal["input_text", "output_text", "text", "refusal"]
    text: StrictStr | None = None
    refusal: StrictStr | None = None


class MessageItem(_Lenient):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: StrictStr | list[TextPart]
    id: StrictStr | None = Field(None, max_length=MAX_ID)
    status: StrictStr | None = None


class FunctionCallItem(_Lenient):
    type: Literal["function_call"]
    call_id: StrictStr = Field(min_length=1, max_length=MAX_ID)
    name: StrictStr = Field(min_length=1, max_length=64)
    arguments: StrictStr
    id: StrictStr | None = Field(None, max_length=MAX_ID)
    status: StrictStr | None = None


class FunctionCallOutputItem(_Lenient):
    type: Literal["function_call_output"]
    call_id: StrictStr = Field(min_length=1, max_length=MAX_ID)
    output: StrictStr | list[TextPart]
    id: StrictStr | None = Field(None, max_length=MAX_ID)
    status: StrictStr | None = None


class ReasoningItem(_Lenient):
    """Reasoning from another model (clients replay it); these models do not read it, so it is skipped."""

    type: Literal["reasoning"]


def _item_type(item: Any) -> Any:
    """An item's `type`; a message may leave it out (OpenAI's "easy input message")."""
    if isinstance(item, dict):
        return item.get("type", "message")
    return getattr(item, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


class FunctionTool(_Lenient):
    type: Literal["function"]
    name: StrictStr = Field(pattern=NAME_PATTERN)
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class FunctionToolChoice(_Lenient):
    type: Literal["function"]
    name: StrictStr = Field(max_length=64)


class TextFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    name: StrictStr = Field("response", pattern=NAME_PATTERN)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: StrictStr | None = None
    strict: StrictBool | None = None


class TextConfig(_Lenient):
    format: TextFormat | None = None
    verbosity: StrictStr | None = None


class ResponsesRequest(_Lenient):
    model: StrictStr = Field(min_length=1, max_length=256)
    input: list[InputItem] | StrictStr | None = Field(None, max_length=MAX_INPUT_ITEMS)  # item errors first
    instructions: StrictStr | None = None
    tools: list[FunctionTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: StrictBool = True
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    metadata: dict[str, StrictStr] | None = None
    store: StrictBool = True
    previous_response_id: StrictStr | None = Field(None, min_length=1, max_length=MAX_ID)
    stream: StrictBool = False
    background: StrictBool = False
    user: StrictStr | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # vLLM's extras, as on chat
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    top_k: int | None = Field(None, ge=-1)
    priority: int = 0
    timeout: float | None = Field(None, gt=0, le=3600)  # longest wait for admission (gateway/http/request_timeout.py)

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        if len(value) > MAX_METADATA_KEYS:
            raise ValueError(f"at most {MAX_METADATA_KEYS} metadata keys are allowed")
        for key, item in value.items():
            if len(key) > MAX_METADATA_KEY or len(item) > MAX_METADATA_VALUE:
                raise ValueError(
                    f"metadata keys are at most {MAX_METADATA_KEY} characters and values at most {MAX_METADATA_VALUE}"
                )
        return value
