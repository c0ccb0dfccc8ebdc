"""What the OpenAI frontend sends to an upstream used as it is, and what it hands back (a scripted upstream; the
real ones are in tests/e2e/test_passthrough_routes.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from gateway.anthropic.convert import chat_request
from gateway.anthropic.protocol import MessagesRequest
from gateway.openai.passthrough import forward, upstream_body
from gateway.openai.protocol import ChatCompletionRequest
from gateway.scheduler.llm.interface import Passthrough

USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}


class Recorder(Passthrough):
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any], int, float | None]] = []

    @property
    def upstream_model(self) -> str:
        return "their-name"

    async def call(
        self, endpoint: str, body: dict[str, Any], priority: int = 0, timeout: float | None = None
    ) -> dict[str, Any]:
        self.sent.append((endpoint, body, priority, timeout))
        return {"model": "their-name", "choices": [], "usage": USAGE}

    async def stream(
        self, endpoint: str, body: dict[str, Any], priority: int = 0, timeout: float | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        self.sent.append((endpoint, body, priority, timeout))

        async def chunks() -> AsyncIterator[dict[str, Any]]:
            yield {"model": "their-name", "choices": [{"index": 0, "delta": {"content": "hi"}}], "usage": None}
            yield {"model": "their-name", "choices": [], "usage": USAGE}

        return chunks()


def test_the_body_is_what_the_client_sent_less_the_gateways_fields() -> None:
    req = ChatCompletionRequest.model_validate(
        {
            "model": "ours",
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}},
            "session_id": "s1",
            "priority": -5,
            "timeout": 2.5,
            "cache_prompt": False,
            "temperature": 0,
        }
    )
    body = upstream_body(req, "their-name")
    assert body == {
        "model": "their-name",
        "temperature": 0.0,
        "cache_prompt": False,
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}},
    }


def test_an_adapters_tool_fields_without_tools_are_left_out() -> None:
    messages = MessagesRequest.model_validate(
        {"model": "ours", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}
    )
    body = upstream_body(chat_request(messages), "their-name")
    assert "parallel_tool_calls" not in body and "tool_choice" not in body
    assert "include_stop_str_in_output" not in body and body["max_tokens"] == 5


async def test_answers_come_back_under_our_name_and_admission_fields_go_to_the_queue() -> None:
    upstream = Recorder()
    req = ChatCompletionRequest.model_validate(
        {"model": "ours", "messages": [{"role": "user", "content": "Hi"}], "timeout": 2.5}
    )
    answer = await forward(upstream, "chat/completions", req, "ours", priority=3)
    assert answer["model"] == "ours" and upstream.sent[0][0] == "chat/completions"
    assert upstream.sent[0][2:] == (3, 2.5) and "timeout" not in upstream.sent[0][1]


async def test_streams_ask_for_usage_and_pass_it_on_only_when_asked() -> None:
    upstream = Recorder()
    req = ChatCompletionRequest.model_validate(
        {"model": "ours", "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    )
    chunks = [c async for c in await forward(upstream, "chat/completions", req, "ours")]  # type: ignore[union-attr]
    assert upstream.sent[0][1]["stream_options"] == {"include_usage": True}
    assert chunks == [{"model": "ours", "choices": [{"index": 0, "delta": {"content": "hi"}}]}]
    asked = ChatCompletionRequest.model_validate(
        {
            "model": "ours",
            "stream": True,
            "messages": [{"role": "user", "content": "Hi"}],
            "stream_options": {"include_usage": True},
        }
    )
    chunks = [c async for c in await forward(upstream, "chat/completions", asked, "ours")]  # type: ignore[union-attr]
    assert chunks[-1] == {"model": "ours", "choices": [], "usage": USAGE}
    forced = [c async for c in await forward(upstream, "chat/completions", req, "ours", True)]  # type: ignore[union-attr]
    assert forced[-1]["usage"] == USAGE
