"""Chat and completions chunk streams as Ollama's NDJSON chunks and whole bodies: text, thinking, whole tool
calls, the final chunk's reason and counts, and errors after the start."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from gateway.errors import RateLimitError
from gateway.ollama.replies import Shape, TextReader, Timer, stream_chunks, whole_body
from gateway.openai.chat_pieces import ChatReader

USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


def _chat_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


CHAT = [
    _chat_chunk({"role": "assistant", "content": ""}),
    _chat_chunk({"reasoning_content": "Let me see."}),
    _chat_chunk({"content": "Checking"}),
    _chat_chunk({"content": " now."}),
    _chat_chunk({"tool_calls": [{"index": 0, "id": "call_a", "function": {"name": "weather", "arguments": ""}}]}),
    _chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
    _chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
    _chat_chunk({"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "time", "arguments": "{}"}}]}),
    _chat_chunk({}, "tool_calls"),
    {"choices": [], "usage": USAGE},
]


async def _replay(chunks: list[dict[str, Any]], fail: Exception | None = None) -> AsyncIterator[dict[str, Any]]:
    for chunk in chunks:
        await asyncio.sleep(0)
        yield chunk
    if fail is not None:
        raise fail


def _timer() -> Timer:
    timer = Timer()
    timer.loaded = timer.submitted = timer.start + 1_000
    timer.first = timer.start + 5_000
    return timer


def _stream(reader: Any, shape: Shape, keep_thinking: bool = True) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        return [c async for c in stream_chunks(reader, shape, keep_thinking, _timer())]

    return asyncio.run(run())


def test_chat_stream_sends_text_thinking_and_whole_calls() -> None:
    chunks = _stream(ChatReader(_replay(CHAT)), Shape(True, "m:latest"))
    assert all(c["model"] == "m:latest" and c["created_at"].endswith("Z") for c in chunks)
    messages = [c["message"] for c in chunks[:-1]]
    assert messages == [
        {"role": "assistant", "content": "", "thinking": "Let me see."},
        {"role": "assistant", "content": "Checking"},
        {"role": "assistant", "content": " now."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_a", "function": {"index": 0, "name": "weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "call_b", "function": {"index": 1, "name": "time", "arguments": {}}}],
        },
    ]
    assert not any(c["done"] for c in chunks[:-1])
    last = chunks[-1]
    assert last["message"] == {"role": "assistant", "content": ""}
    assert (last["done"], last["done_reason"], last["prompt_eval_count"], last["eval_count"]) == (True, "stop", 11, 7)
    assert last["load_duration"] == 1_000 and last["prompt_eval_duration"] == 4_000
    assert last["eval_duration"] > 0 and last["total_duration"] >= last["eval_duration"] + 5_000


def test_chat_body_gathers_the_answer() -> None:
    body = asyncio.run(whole_body(ChatReader(_replay(CHAT)), Shape(True, "m"), True, _timer()))
    assert body["message"] == {
        "role": "assistant",
        "content": "Checking now.",
        "thinking": "Let me see.",
        "tool_calls": [
            {"id": "call_a", "function": {"index": 0, "name": "weather", "arguments": {"city": "Paris"}}},
            {"id": "call_b", "function": {"index": 1, "name": "time", "arguments": {}}},
        ],
    }
    assert body["done"] and body["done_reason"] == "stop" and body["eval_count"] == 7


def test_thinking_is_dropped_when_think_is_false() -> None:
    body = asyncio.run(whole_body(ChatReader(_replay(CHAT)), Shape(True, "m"), False, _timer()))
    assert "thinking" not in body["message"]


def _completion_chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}


def test_generate_puts_text_in_response_and_reports_length() -> None:
    chunks = [_completion_chunk("Hello"), _completion_chunk(" there", "length"), {"choices": [], "usage": USAGE}]
    streamed = _stream(TextReader(_replay(chunks)), Shape(False, "m"))
    assert [c["response"] for c in streamed] == ["Hello", " there", ""]
    assert streamed[-1]["done_reason"] == "length" and "message" not in streamed[-1]
    body = asyncio.run(whole_body(TextReader(_replay(chunks)), Shape(False, "m"), True, _timer()))
    assert body["response"] == "Hello there" and body["done_reason"] == "length" and body["prompt_eval_count"] == 11


def test_an_error_after_the_start_is_ollamas_error_line() -> None:
    failing = _replay(CHAT[:3], RateLimitError("the model's queue is full; retry shortly"))
    chunks = _stream(ChatReader(failing), Shape(True, "m"))
    assert chunks[-1] == {"error": "the model's queue is full; retry shortly"}
    assert chunks[0]["message"]["thinking"] == "Let me see." and len(chunks) == 3
