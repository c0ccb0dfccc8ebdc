"""A streamed chat answer as Anthropic's Messages events.

`message_start`, then per content block `content_block_start`, its deltas (`thinking_delta` and a closing
`signature_delta`, `text_delta` or `input_json_delta`) and
`content_block_stop`, then `message_delta` (stop_reason, stop_sequence, usage) and `message_stop`. A failure
after the stream started sends an `error` event in Anthropic's shape. With stop sequences, the last characters of
the text are held back until it is known whether they are the stop sequence that ended the answer (which is cut,
as in the non-streamed answer).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from sse_starlette.sse import EventSourceResponse

from gateway.anthropic.convert import cut_stop, stop_reason, thinking_block, usage
from gateway.errors import SwitchyardError
from gateway.http.sse import typed_events_response
from gateway.openai.chat_pieces import CallStart, ChatReader, Reasoning, Text


class _Blocks:
    """The content block being streamed and the index of the next one."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None

    def start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self.stop()
        self.index += 1
        self.kind = block["type"]
        return [*events, {"type": "content_block_start", "index": self.index, "content_block": block}]

    def stop(self) -> list[dict[str, Any]]:
        if self.kind is None:
            return []
        signature = (
            [
                {
                    "type": "content_block_delta",
                    "index": self.index,
                    "delta": {"type": "signature_delta", "signature": ""},
                }
            ]
            if self.kind == "thinking"
            else []
        )
        self.kind = None
        return [*signature, {"type": "content_block_stop", "index": self.index}]


async def message_events(
    chunks: AsyncIterator[dict[str, Any]], start: dict[str, Any], stops: list[str] | None
) -> AsyncIterator[dict[str, Any]]:
    """Chat completion chunks (one choice, usage chunk last) -> Messages events. `start` is the empty Message."""
    yield {"type": "message_start", "message": start}
    blocks = _Blocks()
    hold = max((len(s) for s in stops or []), default=0)
    pending = ""  # text not sent yet (it may be the stop sequence)
    called = False
    reader = ChatReader(chunks)

    def text_events(text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        events = blocks.start({"type": "text", "text": ""}) if blocks.kind != "text" else []
        return [
            *events,
            {"type": "content_block_delta", "index": blocks.index, "delta": {"type": "text_delta", "text": text}},
        ]

    try:
        async for piece in reader.pieces():
            if isinstance(piece, Reasoning):
                for event in blocks.start(thinking_block("")) if blocks.kind != "thinking" else []:
                    yield event
                yield {
                    "type": "content_block_delta",
                    "index": blocks.index,
                    "delta": {"type": "thinking_delta", "thinking": piece.text},
                }
            elif isinstance(piece, Text):
                pending += piece.text
                cut = max(0, len(pending) - hold)
                for event in text_events(pending[:cut]):
                    yield event
                pending = pending[cut:]
            elif isinstance(piece, CallStart):
                for event in text_events(pending):
                    yield event
                pending = ""
                called = True
                for event in blocks.start({"type": "tool_use", "id": piece.call_id, "name": piece.name, "input": {}}):
                    yield event
            else:  # CallArguments
                yield {
                    "type": "content_block_delta",
                    "index": blocks.index,
                    "delta": {"type": "input_json_delta", "partial_json": piece.fragment},
                }
        rest, stop = cut_stop(pending, reader.finish_reason, stops)
        for event in [*text_events(rest), *blocks.stop()]:
            yield event
    except SwitchyardError as exc:
        yield exc.anthropic_body()
        return
    counts = usage(reader.usage) if reader.usage is not None else {"output_tokens": 0}
    yield {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason(reader.finish_reason, stop, called), "stop_sequence": stop},
        "usage": counts,
    }
    yield {"type": "message_stop"}


def events_response(events: AsyncIterator[dict[str, Any]], send_timeout_s: float) -> EventSourceResponse:
    return typed_events_response(events, send_timeout_s, lambda error: error.anthropic_body())
