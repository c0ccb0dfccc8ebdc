"""A streamed chat answer read back as pieces (text, the start of a tool call, argument fragments), its finish
reason and its usage. Frontends that stream in another protocol (Responses, Messages) translate these pieces
instead of each walking the chat chunks' nesting."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class CallStart:
    call_id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    fragment: str


Piece = Text | CallStart | CallArguments


class ChatReader:
    """Reads a one-choice chat chunk stream (as `chat_completion` streams it): `pieces()` yields its text and tool
    calls in order; `finish_reason` and `usage` (OpenAI's chat usage object) are set as they arrive."""

    def __init__(self, chunks: AsyncIterator[dict[str, Any]]) -> None:
        self._chunks = chunks
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    async def pieces(self) -> AsyncIterator[Piece]:
        async for chunk in self._chunks:
            if chunk.get("usage") and not chunk["choices"]:
                self.usage = chunk["usage"]
            for choice in chunk["choices"]:
                delta = choice["delta"]
                if delta.get("content"):
                    yield Text(delta["content"])
                for call in delta.get("tool_calls") or []:
                    if call.get("id") is not None:
                        yield CallStart(call["id"], call["function"]["name"])
                    if call["function"].get("arguments"):
                        yield CallArguments(call["function"]["arguments"])
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
