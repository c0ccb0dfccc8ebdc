"""Stream plumbing: errors after the start, priming before the start, and naming too-deep fields."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from engines.types import GenerationOutput, SamplingParams
from gateway.errors import InternalError, InvalidRequestError, RateLimitError
from gateway.http.body_depth import deepest_field
from gateway.http.sse import _frames
from gateway.openai.fanout import Choice, merged_stream, primed

FIRST = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [FIRST]}


async def _failing(exc: Exception) -> AsyncIterator[dict]:
    yield CHUNK
    raise exc


def frames_of(exc: Exception) -> list[str]:
    async def run() -> list[str]:
        return [f["data"] async for f in _frames(_failing(exc))]

    return asyncio.run(run())


def test_error_after_the_stream_started_is_an_error_event_then_done() -> None:
    frames = frames_of(RateLimitError("the model's queue is full; retry shortly"))
    assert json.loads(frames[0]) == CHUNK
    assert json.loads(frames[1]) == {
        "error": {
            "message": "the model's queue is full; retry shortly",
            "type": "rate_limit_error",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    assert frames[2:] == ["[DONE]"]


def test_unexpected_errors_leak_nothing() -> None:
    frames = frames_of(RuntimeError("/secret/path/model.py line 3"))
    err = json.loads(frames[1])["error"]
    assert err["type"] == "internal_error" and "/secret" not in err["message"]
    assert frames[2] == "[DONE]"


def test_the_openai_sdk_raises_on_our_error_event() -> None:
    body = "".join(f"data: {f}\n\n" for f in frames_of(InvalidRequestError("bad thing", param="x"))).encode()
    transport = httpx.MockTransport(
        lambda request: httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
    )
    client = openai.OpenAI(base_url="http://test/v1", api_key="x", http_client=httpx.Client(transport=transport))
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
    with pytest.raises(openai.APIError, match="bad thing"):
        for _ in stream:
            pass


class FakeScheduler:
    """Just enough of LLMScheduler for fanout: `generate` per the given behaviour; records closed streams."""

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.closed: list[str] = []

    async def generate(self, request) -> AsyncIterator[GenerationOutput]:
        try:
            if self.behaviour == "full":
                raise RateLimitError("the model's queue is full; retry shortly", headers={"Retry-After": "1"})
            if self.behaviour == "error":
                yield GenerationOutput(request.request_id, [], "", True, "error", error="boom")
                return
            for i in range(3):
                await asyncio.sleep(0)
                yield GenerationOutput(request.request_id, [i], f"t{i}", i == 2, "stop" if i == 2 else None)
        finally:
            self.closed.append(request.request_id)


def _choices(n: int) -> list[Choice]:
    return [Choice(i, [1, 2], SamplingParams()) for i in range(n)]


@pytest.mark.parametrize("n", [1, 2])
def test_priming_turns_admission_failures_into_errors_before_the_response(n: int) -> None:
    scheduler = FakeScheduler("full")

    async def run() -> None:
        await primed(merged_stream(scheduler, _choices(n)))  # type: ignore[arg-type]

    with pytest.raises(RateLimitError) as info:
        asyncio.run(run())
    assert info.value.status == 429 and info.value.headers == {"Retry-After": "1"}


def test_priming_turns_a_failed_first_step_into_an_error() -> None:
    async def run() -> None:
        await primed(merged_stream(FakeScheduler("error"), _choices(1)))  # type: ignore[arg-type]

    with pytest.raises(InternalError):
        asyncio.run(run())


@pytest.mark.parametrize("n", [1, 2])
def test_primed_stream_yields_everything_and_closes(n: int) -> None:
    scheduler = FakeScheduler("ok")

    async def run() -> list[tuple[int, str]]:
        stream = await primed(merged_stream(scheduler, _choices(n)))  # type: ignore[arg-type]
        return [(i, out.text) async for i, out in stream]

    items = asyncio.run(run())
    for i in range(n):
        assert [t for idx, t in items if idx == i] == ["t0", "t1", "t2"]
    assert len(scheduler.closed) == n


def test_deepest_field_names_the_culprit() -> None:
    deep = b'{"model": "m", "note": "{{{{[[[\\"}", "response_format": ' + b'{"a": ' * 300 + b"1" + b"}" * 301
    assert deepest_field(deep) == "response_format"
    assert deepest_field(b'{"tools": [' + b"[" * 200 + b"]" * 201 + b"}") == "tools"
    assert deepest_field(b'{"model": "m", "messages": [{"role": "user"}]}') is None
