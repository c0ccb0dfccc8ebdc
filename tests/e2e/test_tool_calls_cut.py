"""A forced tool call cut by the output cap: OpenAI never puts text in `content` for a forced call, it returns the
partial call with `finish_reason: length` (chat, streamed chat) and an `incomplete` response (Responses)."""

from __future__ import annotations

import json

import openai
import pytest

from tests.conftest import DEFAULT_MODEL
from tests.e2e.weather_tools import ASK, TIME, WEATHER

NAMES = {"get_weather", "get_time"}


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def _full(client: openai.OpenAI, **kw):
    return client.chat.completions.create(
        model=DEFAULT_MODEL, messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=300, **kw
    )


def _cut(client: openai.OpenAI, max_tokens: int, stream: bool = False, **kw):
    return client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=ASK,
        tools=[WEATHER, TIME],
        temperature=0,
        max_tokens=max_tokens,
        stream=stream,
        **kw,
    )


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_call_cut_by_max_tokens_is_a_partial_call(client: openai.OpenAI, choice) -> None:
    full = _full(client, tool_choice=choice)
    total = full.usage.completion_tokens
    assert full.choices[0].finish_reason == "tool_calls"
    for limit in sorted({1, 3, total // 2, total - 2}):
        cut = _cut(client, limit, tool_choice=choice)
        msg = cut.choices[0].message
        assert cut.choices[0].finish_reason == "length", limit
        assert msg.content is None, (limit, msg.content)
        if isinstance(choice, dict):  # the name is known from the first token on
            assert [c.function.name for c in msg.tool_calls] == ["get_time"], limit
        for call in msg.tool_calls or []:
            assert call.id.startswith("call_") and call.type == "function" and call.function.name in NAMES


def test_second_unfinished_call_is_not_content(client: openai.OpenAI) -> None:
    full = _full(client, tool_choice="required")
    whole = full.choices[0].message.tool_calls
    assert len(whole) >= 2, "the model should call both tools for this question"
    cut_inside = 0
    for limit in range(full.usage.completion_tokens - 1, full.usage.completion_tokens - 17, -1):
        cut = _cut(client, limit, tool_choice="required")
        msg = cut.choices[0].message
        assert cut.choices[0].finish_reason == "length" and msg.content is None, limit
        assert len(msg.tool_calls) == len(whole), limit
        assert msg.tool_calls[0].function.arguments == whole[0].function.arguments  # the finished one is whole
        last = msg.tool_calls[-1].function
        assert last.name == whole[-1].function.name
        try:
            assert json.loads(last.arguments) == json.loads(whole[-1].function.arguments)  # only its tag was cut
        except ValueError:  # cut inside its arguments: they are the start of the whole call's
            cut_inside += 1
            assert whole[-1].function.arguments.startswith(last.arguments.rstrip("}"))
    assert cut_inside, "some limit should cut the last call's arguments"


def test_streamed_forced_call_cut_by_max_tokens(client: openai.OpenAI) -> None:
    full = _full(client, tool_choice="required")
    for limit in (2, full.usage.completion_tokens - 4):
        text, calls, finish = "", {}, None
        for chunk in _cut(client, limit, stream=True, tool_choice="required"):
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for tc in choice.delta.tool_calls or []:
                    if tc.id:
                        calls[tc.index] = [tc.function.name, tc.function.arguments or ""]
                    else:
                        calls[tc.index][1] += tc.function.arguments or ""
                finish = choice.finish_reason or finish
        assert text == "", (limit, text)
        assert finish == "length"
        assert all(name in NAMES for name, _ in calls.values())
    whole = full.choices[0].message.tool_calls
    assert len(calls) == len(whole) and calls[0][0] == whole[0].function.name
    assert json.loads(calls[0][1]) == json.loads(whole[0].function.arguments)


def test_responses_forced_call_cut_is_incomplete(client: openai.OpenAI) -> None:
    tools = [{"type": "function", **t["function"]} for t in (WEATHER, TIME)]
    full = client.responses.create(
        model=DEFAULT_MODEL,
        input=ASK[0]["content"],
        tools=tools,
        tool_choice="required",
        temperature=0,
        max_output_tokens=300,
        store=False,
    )
    assert full.status == "completed"
    limit = full.usage.output_tokens - 4
    resp = client.responses.create(
        model=DEFAULT_MODEL,
        input=ASK[0]["content"],
        tools=tools,
        tool_choice="required",
        temperature=0,
        max_output_tokens=limit,
        store=False,
    )
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in resp.output] == ["function_call"] * len(full.output)
    assert resp.output[-1].status == "incomplete"
    # the SDK's `responses.stream` helper insists on `response.completed`; the raw stream ends in `response.incomplete`
    events = list(
        client.responses.create(
            model=DEFAULT_MODEL,
            input=ASK[0]["content"],
            tools=tools,
            stream=True,
            tool_choice="required",
            temperature=0,
            max_output_tokens=limit,
            store=False,
        )
    )
    kinds = [event.type for event in events]
    final = events[-1].response
    assert "response.output_text.delta" not in kinds and kinds[-1] == "response.incomplete"
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in final.output] == ["function_call"] * len(full.output)
    assert final.output[-1].status == "incomplete"
    assert [i.arguments for i in final.output] == [i.arguments for i in resp.output]
