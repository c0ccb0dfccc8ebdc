"""Chat chunks -> Responses events: the documented order, sequence numbers, items and the final object."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from gateway.errors import ServiceUnavailableError
from gateway.responses.events import response_events


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


async def _stream(chunks: list[dict[str, Any]], fail: bool = False) -> AsyncIterator[dict[str, Any]]:
    for chunk in chunks:
        yield chunk
    if fail:
        raise ServiceUnavailableError("the engine stopped")


async def _finish(output, usage, reason, error):  # noqa: ANN001, ANN202 (the Finisher signature)
    status = "failed" if error else ("incomplete" if reason == "length" else "completed")
    return {"status": status, "output": output, "usage": usage}


async def _events(chunks: list[dict[str, Any]], fail: bool = False) -> list[dict[str, Any]]:
    return [e async for e in response_events(_stream(chunks, fail), {"status": "in_progress"}, _finish)]


async def test_text_then_call_in_order_with_sequence_numbers() -> None:
    events = await _events(
        [
            _chunk({"role": "assistant", "content": ""}),
            _chunk({"content": "Let me "}),
            _chunk({"content": "check."}),
            _chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                }
            ),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
            _chunk({}, "tool_calls"),
            {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}},
        ]
    )
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = events[-1]["response"]
    message, call = final["output"]
    assert message["content"][0]["text"] == "Let me check." and message["status"] == "completed"
    assert call["call_id"] == "call_1" and call["arguments"] == '{"city": "Paris"}' and call["status"] == "completed"
    assert events[9]["item"]["id"] == call["id"] == events[10]["item_id"]  # one item id from added to done
    assert final["usage"]["total_tokens"] == 7


async def test_empty_answer_is_one_empty_message_and_length_is_incomplete() -> None:
    events = await _events([_chunk({"role": "assistant", "content": ""}), _chunk({}, "length")])
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == ""


async def test_failure_mid_stream_sends_error_then_failed() -> None:
    events = await _events([_chunk({"content": "Hel"})], fail=True)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["code"] == "service_unavailable" and events[-2]["message"] == "the engine stopped"
