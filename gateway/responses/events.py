"""A streamed chat answer as the Responses API's server-sent events, each with its `sequence_number`.

The sequence is OpenAI's: `response.created`, `response.in_progress`, then per output item
`response.output_item.added`, its content (`response.content_part.added`, `response.output_text.delta`...,
`response.output_text.done`, `response.content_part.done`; for reasoning the same with `response.reasoning_text.*`;
or `response.function_call_arguments.delta`...,
`response.function_call_arguments.done`) and `response.output_item.done`; last `response.completed` (or
`response.incomplete` when the output cap was hit). A failure after the stream started sends `error` and
`response.failed`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sse_starlette.sse import EventSourceResponse

from gateway.errors import SwitchyardError
from gateway.http.sse import typed_events_response
from gateway.openai.chat_pieces import CallStart, ChatReader, Reasoning, Text
from gateway.responses.convert import function_call_item, item_id, item_status, message_item, reasoning_item

# (output items, chat usage, finish_reason, error) -> the final Response object (stored when asked)
Finisher = Callable[
    [list[dict[str, Any]], dict[str, Any] | None, str | None, SwitchyardError | None], Awaitable[dict[str, Any]]
]


class _Sequencer:
    def __init__(self) -> None:
        self.number = 0

    def __call__(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.number, **fields}
        self.number += 1
        return event


class _OpenItem:
    """The output item being streamed: a message (text) or a function call (arguments)."""

    def __init__(self, index: int, item: dict[str, Any]) -> None:
        self.index = index
        self.item = item
        self.text = ""


def _open_text(
    ev: _Sequencer, output: list[dict[str, Any]], kind: str = "message"
) -> tuple[_OpenItem, list[dict[str, Any]]]:
    if kind == "message":
        item = {**message_item("", "in_progress", item_id("msg")), "content": []}
        part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    else:
        item = {**reasoning_item("", "in_progress", item_id("rs")), "content": []}
        part = {"type": "reasoning_text", "text": ""}
    current = _OpenItem(len(output), item)
    output.append(item)
    return current, [
        ev("response.output_item.added", output_index=current.index, item=item),
        ev("response.content_part.added", item_id=item["id"], output_index=current.index, content_index=0, part=part),
    ]


def _close(
    ev: _Sequencer, output: list[dict[str, Any]], current: _OpenItem, status: str = "completed"
) -> list[dict[str, Any]]:
    item = current.item
    index = current.index
    if item["type"] in ("message", "reasoning"):
        reasoning = item["type"] == "reasoning"
        done = (reasoning_item if reasoning else message_item)(current.text, status, item["id"])
        part = done["content"][0]
        text_done = (
            ev(
                "response.reasoning_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=current.text,
            )
            if reasoning
            else ev(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=current.text,
                logprobs=[],
            )
        )
        events = [
            text_done,
            ev("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part),
        ]
    else:
        done = function_call_item(item["call_id"], item["name"], current.text, status, item["id"])
        events = [
            ev(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=current.text,
            )
        ]
    output[index] = done
    return [*events, ev("response.output_item.done", output_index=index, item=done)]


async def response_events(
    chunks: AsyncIterator[dict[str, Any]], start: dict[str, Any], finish: Finisher
) -> AsyncIterator[dict[str, Any]]:
    """Chat completion chunks (one choice, usage chunk last) -> Responses events."""
    ev = _Sequencer()
    yield ev("response.created", response=start)
    yield ev("response.in_progress", response=start)
    output: list[dict[str, Any]] = []
    current: _OpenItem | None = None
    reader = ChatReader(chunks)
    try:
        async for piece in reader.pieces():
            if isinstance(piece, (Text, Reasoning)):
                kind = "message" if isinstance(piece, Text) else "reasoning"
                if current is None or current.item["type"] != kind:
                    for event in _close(ev, output, current) if current else []:
                        yield event
                    current, events = _open_text(ev, output, kind)
                    for event in events:
                        yield event
                current.text += piece.text
                if kind == "message":
                    yield ev(
                        "response.output_text.delta",
                        item_id=current.item["id"],
                        output_index=current.index,
                        content_index=0,
                        delta=piece.text,
                        logprobs=[],
                    )
                else:
                    yield ev(
                        "response.reasoning_text.delta",
                        item_id=current.item["id"],
                        output_index=current.index,
                        content_index=0,
                        delta=piece.text,
                    )
            elif isinstance(piece, CallStart):
                for event in _close(ev, output, current) if current else []:
                    yield event
                item = function_call_item(piece.call_id, piece.name, "", "in_progress")
                current = _OpenItem(len(output), item)
                output.append(item)
                yield ev("response.output_item.added", output_index=current.index, item=item)
            elif current is not None:  # CallArguments
                current.text += piece.fragment
                yield ev(
                    "response.function_call_arguments.delta",
                    item_id=current.item["id"],
                    output_index=current.index,
                    delta=piece.fragment,
                )
        if current is None and not output:  # an empty answer is still one (empty) message
            current, events = _open_text(ev, output)
            for event in events:
                yield event
        last = item_status(reader.finish_reason, True)
        for event in _close(ev, output, current, last) if current else []:
            yield event
    except SwitchyardError as exc:
        yield ev("error", code=exc.code or exc.type, message=exc.message, param=exc.param)
        yield ev("response.failed", response=await finish(output, reader.usage, reader.finish_reason, exc))
        return
    final = await finish(output, reader.usage, reader.finish_reason, None)
    yield ev(f"response.{final['status']}", response=final)


def _failure(error: SwitchyardError) -> dict[str, Any]:
    return {"type": "error", "code": error.code, "message": error.message, "param": None}


def events_response(events: AsyncIterator[dict[str, Any]], send_timeout_s: float) -> EventSourceResponse:
    return typed_events_response(events, send_timeout_s, _failure)
