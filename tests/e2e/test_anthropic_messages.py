"""Anthropic's Messages API through the real anthropic SDK and langchain-anthropic against the real server."""

from __future__ import annotations

import anthropic
import httpx
import pytest
from langchain_anthropic import ChatAnthropic

from tests.conftest import DEFAULT_MODEL

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}  # the current SDK has no sampling arguments; clients send them in the body
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def client(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=300)


def test_greedy_answer_equals_chat(client: anthropic.Anthropic, base_url: str) -> None:
    chat = httpx.post(
        f"{base_url}/v1/chat/completions",
        timeout=300,
        json={"model": DEFAULT_MODEL, "temperature": 0, "max_tokens": 40, "messages": QUESTION},
    ).json()
    message = client.messages.create(model=DEFAULT_MODEL, max_tokens=40, messages=QUESTION, extra_body=GREEDY)
    assert message.content[0].text == chat["choices"][0]["message"]["content"]
    assert "Paris" in message.content[0].text
    assert message.stop_reason == "end_turn" and message.role == "assistant" and message.id.startswith("msg_")
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == chat["usage"]["prompt_tokens"]
    assert usage.output_tokens == chat["usage"]["completion_tokens"]
    count = client.messages.count_tokens(model=DEFAULT_MODEL, messages=QUESTION)
    assert count.input_tokens == chat["usage"]["prompt_tokens"]


def test_stream_matches_create(client: anthropic.Anthropic) -> None:
    full = client.messages.create(model=DEFAULT_MODEL, max_tokens=40, messages=QUESTION, extra_body=GREEDY)
    with client.messages.stream(model=DEFAULT_MODEL, max_tokens=40, messages=QUESTION, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == full.content[0].text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == full.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens > 0


def test_raw_stream_event_sequence(client: anthropic.Anthropic) -> None:
    events = list(
        client.messages.create(model=DEFAULT_MODEL, max_tokens=5, messages=QUESTION, stream=True, extra_body=GREEDY)
    )
    types = [e.type for e in events]
    assert types[:2] == ["message_start", "content_block_start"] and types[-3:] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert set(types[2:-3]) == {"content_block_delta"}
    assert events[0].message.usage.input_tokens > 0
    assert events[-2].delta.stop_reason == "max_tokens" and events[-2].usage.output_tokens == 5


def test_stop_sequences_name_the_one_that_matched(client: anthropic.Anthropic) -> None:
    full = client.messages.create(model=DEFAULT_MODEL, max_tokens=40, messages=QUESTION, extra_body=GREEDY)
    stop = " Paris"
    assert stop in full.content[0].text
    expected = full.content[0].text.split(stop)[0]
    cut = client.messages.create(
        model=DEFAULT_MODEL, max_tokens=40, messages=QUESTION, stop_sequences=[stop], extra_body=GREEDY
    )
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == expected
    with client.messages.stream(
        model=DEFAULT_MODEL, max_tokens=40, messages=QUESTION, stop_sequences=[stop], extra_body=GREEDY
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == expected and final.stop_sequence == stop and final.stop_reason == "stop_sequence"


def test_tool_round_trip(client: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.messages.create(
        model=DEFAULT_MODEL,
        max_tokens=60,
        messages=ask,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=GREEDY,
    )
    assert first.stop_reason == "tool_use"
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and isinstance(use.input["city"], str)
    answer = client.messages.create(
        model=DEFAULT_MODEL,
        max_tokens=60,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "none"},
        extra_body=GREEDY,
        messages=[
            *ask,
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "22 degrees celsius and sunny"}],
            },
        ],
    )
    assert answer.stop_reason == "end_turn" and answer.content[0].type == "text" and answer.content[0].text
    with client.messages.stream(
        model=DEFAULT_MODEL,
        max_tokens=60,
        messages=ask,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body=GREEDY,
    ) as stream:
        final = stream.get_final_message()
    [streamed] = [b for b in final.content if b.type == "tool_use"]
    assert streamed.input == use.input and final.stop_reason == "tool_use"
    counted = client.messages.count_tokens(model=DEFAULT_MODEL, messages=ask, tools=[WEATHER_TOOL])
    assert counted.input_tokens == first.usage.input_tokens + first.usage.cache_read_input_tokens


def test_langchain_chat_anthropic(base_url: str) -> None:
    llm = ChatAnthropic(
        base_url=base_url,
        api_key="unused",
        model=DEFAULT_MODEL,
        temperature=0,
        max_tokens=40,
        max_retries=0,
        timeout=300,
    )
    answer = llm.invoke("What is the capital of France?")
    assert "Paris" in answer.text and answer.usage_metadata["output_tokens"] > 0
    assert "".join(chunk.text for chunk in llm.stream("What is the capital of France?")) == answer.text
    calls = llm.bind_tools([WEATHER_TOOL], tool_choice="get_weather").invoke("What is the weather in Paris?")
    assert [c["name"] for c in calls.tool_calls] == ["get_weather"]


def test_bad_inputs_are_anthropic_errors(base_url: str) -> None:
    url = f"{base_url}/v1/messages"
    ok = {"model": DEFAULT_MODEL, "max_tokens": 5, "messages": QUESTION}
    cases = [
        {k: v for k, v in ok.items() if k != "max_tokens"},  # max_tokens is required, as on Anthropic
        {**ok, "max_tokens": "many"},
        {**ok, "messages": "hi"},
        {**ok, "messages": []},
        {**ok, "messages": [{"role": "system", "content": "x"}]},
        {**ok, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
        {**ok, "temperature": 1.5},  # Anthropic's range is 0..1
        {**ok, "tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": "no_such_tool"}},
        {**ok, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        {
            **ok,
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_unknown", "content": "x"}]}
            ],
        },
        {**ok, "messages": [*QUESTION, {"role": "assistant", "content": "The capital"}]},
        {**ok, "messages": [{"role": "user", "content": "hi " * 9000}]},  # beyond the context
        {**ok, "max_tokens": 10**9},
    ]
    for body in cases:
        resp = httpx.post(url, json=body, timeout=60)
        assert resp.status_code == 400, (body, resp.text)
        error = resp.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
        assert error["error"]["message"]
    missing = httpx.post(url, json={**ok, "model": "nope"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    bad_version = httpx.post(url, json=ok, headers={"anthropic-version": "yesterday"})
    assert bad_version.status_code == 400 and bad_version.json()["type"] == "error"
    count = httpx.post(f"{url}/count_tokens", json={"model": DEFAULT_MODEL})
    assert count.status_code == 400 and count.json()["error"]["type"] == "invalid_request_error"
    not_json = httpx.post(url, content=b"{", headers={"content-type": "application/json"})
    assert not_json.status_code == 400 and not_json.json()["type"] == "error"
