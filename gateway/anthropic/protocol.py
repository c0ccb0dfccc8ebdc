"""Request models for Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens).

`max_tokens` is required, as on Anthropic's API. Content blocks are checked by `type`: text, tool_use, tool_result
(and thinking blocks, which clients replay and these models do not read). Images, documents and server tools are
refused with a 400 that names the block. Unknown fields are accepted and logged.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictStr, field_validator

from gateway.openai.protocol import MAX_STOP_LENGTH, MAX_STOP_SEQUENCES, MAX_TOOLS, NAME_PATTERN, _Lenient

MAX_MESSAGES = 4096
MAX_ID = 256


class TextBlock(_Lenient):
    type: Literal["text"]
    text: StrictStr


class ToolUseBlock(_Lenient):
    type: Literal["tool_use"]
    id: StrictStr = Field(min_length=1, max_length=MAX_ID)
    name: StrictStr = Field(min_length=1, max_length=64)
    input: dict[str, Any]


class ToolResultBlock(_Lenient):
    type: Literal["tool_result"]
    tool_use_id: StrictStr = Field(min_length=1, max_length=MAX_ID)
    content: StrictStr | list[TextBlock] = ""
    is_error: StrictBool = False


class ThinkingBlock(_Lenient):
    """Thinking from another model (clients replay it); skipped."""

    type: Literal["thinking", "redacted_thinking"]


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock, Field(discriminator="type")]


class Message(_Lenient):
    role: Literal["user", "assistant"]
    content: StrictStr | list[ContentBlock]


class Tool(_Lenient):
    type: Literal["custom"] | None = None  # client tools; server tools (web search, ...) are not served here
    name: StrictStr = Field(pattern=NAME_PATTERN)
    description: StrictStr | None = None
    input_schema: dict[str, Any]


class ToolChoice(_Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: StrictStr | None = Field(None, max_length=64)
    disable_parallel_tool_use: StrictBool = False


class Metadata(_Lenient):
    user_id: StrictStr | None = Field(None, max_length=256)


class CountTokensRequest(_Lenient):
    model: StrictStr = Field(min_length=1, max_length=256)
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: StrictStr | list[TextBlock] | None = None
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None


class ThinkingConfig(_Lenient):
    """Extended thinking: passed to the chat template as `enable_thinking` (Qwen 3 reads it; others ignore it)."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=1)


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[StrictStr] | None = Field(None, max_length=MAX_STOP_SEQUENCES)
    stream: StrictBool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0)  # Anthropic's range
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    metadata: Metadata | None = None
    thinking: ThinkingConfig | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not s or len(s) > MAX_STOP_LENGTH for s in value):
            raise ValueError(f"each stop sequence must be 1 to {MAX_STOP_LENGTH} characters")
        return value
