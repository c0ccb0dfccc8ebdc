"""A streamed answer of the OpenAI path as Ollama's answers: NDJSON chunks, or one body when `stream` is false.

Every chunk carries `model`, `created_at` and `done`; /api/chat puts the text in `message.content` (reasoning in
`message.thinking`, tool calls whole in `message.tool_calls`, each once its arguments are complete, as Ollama sends
them), /api/generate in `response` (and `thinking`). The last chunk has `done: true`, `done_reason` (`stop`, or
`length` when the token limit or the context ended it) and the counts and durations in nanoseconds:
`total_duration` (the whole request), `load_duration` (finding the model), `prompt_eval_duration` (until the first
token: the prompt's prefill), `eval_duration` (the tokens after it), `prompt_eval_count` (the prompt's tokens, those
read from the prefix cache included) and `eval_count` (the answer's tokens). A failure after the stream started ends
it with `{"error": "..."}`, Ollama's in-stream error.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from gateway.errors import SwitchyardError
from gateway.openai.chat_pieces import CallArguments, CallStart, Piece, Reasoning, Text

DONE_REASONS = {"length": "length"}  # anything else that ends an answer (stop, a tool call, EOS) is "stop"


def created_at() -> str:
    """Now as Ollama writes it (RFC 3339, UTC, fractional seconds)."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass
class Timer:
    """When the request's steps happened (perf_counter_ns) for the final chunk's durations."""

    start: int = field(default_factory=time.perf_counter_ns)
    loaded: int = 0  # the model was found (and loaded)
    submitted: int = 0  # the prompt went to the scheduler
    first: int = 0  # the first token came back

    @staticmethod
    def now() -> int:
        return time.perf_counter_ns()


class TextReader:
    """A one-choice completions chunk stream read as text pieces, with its finish reason and usage (the same
    interface as the chat path's ChatReader)."""

    def __init__(self, chunks: AsyncIterator[dict[str, Any]]) -> None:
        self._chunks = chunks
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    async def pieces(self) -> AsyncIterator[Piece]:
        async for chunk in self._chunks:
            if chunk.get("usage") and not chunk["choices"]:
                self.usage = chunk["usage"]
            for choice in chunk["choices"]:
                if choice.get("text"):
                    yield Text(choice["text"])
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]


class Reader(Protocol):
    """What replies read: the chat path's ChatReader or TextReader."""

    finish_reason: str | None
    usage: dict[str, Any] | None

    def pieces(self) -> AsyncIterator[Piece]: ...


def _arguments(text: str) -> dict[str, Any]:
    """A call's arguments as an object (Ollama's shape); text that is not a JSON object becomes {}."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Shape:
    """Where an answer's parts go: /api/chat's `message` or /api/generate's `response`."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        self.model = model

    def part(self, text: str = "", thinking: str = "", calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "created_at": created_at()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            out["message"] = message
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
        return out


async def _parts(reader: Reader, shape: Shape, keep_thinking: bool) -> AsyncIterator[dict[str, Any]]:
    """The answer's pieces as Ollama's partial bodies; a tool call once its arguments are whole."""
    call: tuple[str, str, list[str]] | None = None
    count = 0

    def finished(call: tuple[str, str, list[str]]) -> dict[str, Any]:
        call_id, name, fragments = call
        return shape.part(
            calls=[
                {"id": call_id, "function": {"index": count, "name": name, "arguments": _arguments("".join(fragments))}}
            ]
        )

    async for piece in reader.pieces():
        if isinstance(piece, CallArguments) and call is not None:
            call[2].append(piece.fragment)
            continue
        if call is not None:
            yield finished(call)
            call, count = None, count + 1
        if isinstance(piece, CallStart):
            call = (piece.call_id, piece.name, [])
        elif isinstance(piece, Reasoning):
            if keep_thinking:
                yield shape.part(thinking=piece.text)
        elif isinstance(piece, Text):
            yield shape.part(text=piece.text)
    if call is not None:
        yield finished(call)


def final_fields(reader: Reader, timer: Timer) -> dict[str, Any]:
    """`done`, `done_reason` and the counts and durations of the last chunk."""
    end = Timer.now()
    usage = reader.usage or {}
    return {
        "done": True,
        "done_reason": DONE_REASONS.get(reader.finish_reason or "stop", "stop"),
        "total_duration": end - timer.start,
        "load_duration": timer.loaded - timer.start,
        "prompt_eval_count": usage.get("prompt_tokens", 0),
        "prompt_eval_duration": timer.first - timer.submitted,
        "eval_count": usage.get("completion_tokens", 0),
        "eval_duration": end - timer.first,
    }


async def stream_chunks(
    reader: Reader, shape: Shape, keep_thinking: bool, timer: Timer
) -> AsyncIterator[dict[str, Any]]:
    """The NDJSON chunks of a streamed answer."""
    try:
        async for part in _parts(reader, shape, keep_thinking):
            yield {**part, "done": False}
    except SwitchyardError as exc:
        yield exc.ollama_body()
        return
    yield {**shape.part(), **final_fields(reader, timer)}


async def whole_body(reader: Reader, shape: Shape, keep_thinking: bool, timer: Timer) -> dict[str, Any]:
    """The body of an answer that is not streamed (`stream: false`)."""
    text: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    async for part in _parts(reader, shape, keep_thinking):
        holder = part["message"] if shape.chat else part
        text.append(holder.get("content", holder.get("response", "")))
        thinking.append(holder.get("thinking", ""))
        calls += holder.get("tool_calls", [])
    return {**shape.part("".join(text), "".join(thinking), calls), **final_fields(reader, timer)}
