"""Request models of Ollama's API (POST /api/chat, /api/generate, /api/embed, /api/embeddings, /api/show, and the
model-management routes), with Ollama's field names.

`stream` defaults to true, as on Ollama. `options` stays a mapping here: options.py reads it (Ollama accepts any
option name and ignores the ones it does not use). Message roles are read case-insensitively, as Ollama does.
Unknown fields are accepted and logged.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator

from gateway.openai.protocol import MAX_TOOLS, NAME_PATTERN, _Lenient

MAX_MESSAGES = 4096
MAX_ID = 256

Think = StrictBool | Literal["low", "medium", "high"]
KeepAlive = StrictInt | float | StrictStr  # seconds, or a Go duration ("5m", "1h30m"); negative: forever


class ToolCallFunction(_Lenient):
    name: StrictStr = Field(min_length=1, max_length=64)
    arguments: dict[str, Any] | StrictStr = Field(default_factory=dict)  # an object on Ollama; some send JSON text
    index: StrictInt | None = None


class ToolCall(_Lenient):
    id: StrictStr | None = Field(None, max_length=MAX_ID)
    function: ToolCallFunction


class Message(_Lenient):
    role: Literal["system", "user", "assistant", "tool"]
    content: StrictStr | None = ""
    thinking: StrictStr | None = None  # earlier reasoning, replayed by clients; chat templates drop it
    images: list[StrictStr] | None = None
    tool_calls: list[ToolCall] | None = Field(None, max_length=MAX_TOOLS)
    tool_name: StrictStr | None = Field(None, max_length=64)
    tool_call_id: StrictStr | None = Field(None, max_length=MAX_ID)

    @field_validator("role", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


class ToolFunction(_Lenient):
    name: StrictStr = Field(pattern=NAME_PATTERN)
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Lenient):
    type: Literal["function"] = "function"
    function: ToolFunction


class GenerationFields(_Lenient):
    """What /api/chat and /api/generate share."""

    model: StrictStr = Field(min_length=1, max_length=256)
    stream: StrictBool | None = None  # None: true, as on Ollama
    format: StrictStr | dict[str, Any] | None = None  # "json" or a JSON schema
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None
    think: Think | None = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None

    @property
    def streamed(self) -> bool:
        return self.stream is not False


class ChatRequest(GenerationFields):
    messages: list[Message] = Field(default_factory=list, max_length=MAX_MESSAGES)  # none: load the model only
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)


class GenerateRequest(GenerationFields):
    prompt: StrictStr = ""  # empty: load (or, with keep_alive 0, unload) the model only
    suffix: StrictStr | None = None
    system: StrictStr | None = None
    template: StrictStr | None = None  # a Go template of .System and .Prompt (go_template.py)
    context: list[StrictInt] | None = None  # deprecated on Ollama
    raw: StrictBool = False
    images: list[StrictStr] | None = None


class EmbedRequest(_Lenient):
    model: StrictStr = Field(min_length=1, max_length=256)
    input: StrictStr | list[StrictStr] | None = None
    truncate: StrictBool = True
    dimensions: StrictInt | None = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None


class EmbeddingsRequest(_Lenient):
    """The legacy /api/embeddings: one `prompt`, one `embedding`."""

    model: StrictStr = Field(min_length=1, max_length=256)
    prompt: StrictStr = ""
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None


class ModelRequest(_Lenient):
    """/api/show, /api/pull, /api/push, /api/delete, /api/create: the model is `model` (`name` in older clients)."""

    model: StrictStr | None = Field(None, max_length=256)
    name: StrictStr | None = Field(None, max_length=256)
    stream: StrictBool | None = None
    verbose: StrictBool | None = None

    @property
    def target(self) -> str:
        return self.model or self.name or ""


class CopyRequest(_Lenient):
    source: StrictStr = Field(max_length=256)
    destination: StrictStr = Field(max_length=256)
