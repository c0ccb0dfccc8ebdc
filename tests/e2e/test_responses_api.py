"""OpenAI's Responses API through the real openai SDK and langchain-openai against the real server and model."""

from __future__ import annotations

import json
import re
import time

import httpx
import openai
import pytest
from langchain_openai import ChatOpenAI

from tests.conftest import DEFAULT_MODEL, ServerProcess

QUESTION = "What is the capital of France?"
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_greedy_answer_equals_chat(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model=DEFAULT_MODEL,
        temperature=0,
        max_tokens=40,
        messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}],
    )
    resp = client.responses.create(
        model=DEFAULT_MODEL, temperature=0, max_output_tokens=40, instructions="Answer briefly.", input=QUESTION
    )
    assert resp.output_text == chat.choices[0].message.content
    assert resp.object == "response" and resp.id.startswith("resp_")
    if chat.choices[0].finish_reason == "length":  # this prompt rambles until the cap
        assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    else:
        assert resp.status == "completed"
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == chat.usage.completion_tokens
    assert resp.output[0].type == "message" and resp.output[0].role == "assistant"


def test_stream_events_and_sequence_numbers(client: openai.OpenAI) -> None:
    full = client.responses.create(
        model=DEFAULT_MODEL, temperature=0, max_output_tokens=40, input=QUESTION, store=False
    )
    with client.responses.stream(model=DEFAULT_MODEL, temperature=0, max_output_tokens=40, input=QUESTION) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert client.responses.retrieve(final.id).output_text == final.output_text  # a streamed response is stored too
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == full.output_text
    assert final.usage.output_tokens == full.usage.output_tokens


def test_store_get_continue_and_delete(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=DEFAULT_MODEL, temperature=0, max_output_tokens=30, input=QUESTION, metadata={"team": "search"}
    )
    got = client.responses.retrieve(first.id)
    assert got.output_text == first.output_text and got.metadata == {"team": "search"}
    second = client.responses.create(
        model=DEFAULT_MODEL,
        temperature=0,
        max_output_tokens=30,
        input="And what is the capital of Germany?",
        previous_response_id=first.id,
    )
    assert second.previous_response_id == first.id and "Berlin" in second.output_text
    # The continued turn prefilled only its new tokens: the conversation's KV session held the first turn's
    # full blocks (prompt and answer), and the usage says so.
    first_turn = first.usage.input_tokens + first.usage.output_tokens - 1
    assert second.usage.input_tokens_details.cached_tokens >= first_turn // 16 * 16 > 0
    # the same conversation sent in full through chat gives the same answer
    chat = client.chat.completions.create(
        model=DEFAULT_MODEL,
        temperature=0,
        max_tokens=30,
        messages=[
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And what is the capital of Germany?"},
        ],
    )
    assert chat.choices[0].message.content == second.output_text
    deleted = client.responses.delete(first.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=DEFAULT_MODEL, input="hi", previous_response_id=first.id)
    assert err.value.body["code"] == "previous_response_not_found"


def test_not_stored_is_not_kept(client: openai.OpenAI) -> None:
    resp = client.responses.create(model=DEFAULT_MODEL, max_output_tokens=2, input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)


def test_tool_round_trip_with_previous_response_id(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model=DEFAULT_MODEL,
        temperature=0,
        max_output_tokens=60,
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    calls = [item for item in resp.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments)["city"]
    answer = client.responses.create(
        model=DEFAULT_MODEL,
        temperature=0,
        max_output_tokens=60,
        previous_response_id=resp.id,
        tools=[WEATHER_TOOL],
        tool_choice="none",
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "22 degrees celsius and sunny"}],
    )
    assert answer.status == "completed" and answer.output_text
    assert answer.usage.input_tokens_details.cached_tokens > 0


def test_streamed_tool_call_events(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=DEFAULT_MODEL,
        temperature=0,
        max_output_tokens=60,
        store=False,
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    call = next(item for item in final.output if item.type == "function_call")
    assert done.arguments == call.arguments and json.loads(call.arguments)["city"]


def test_text_format_json_schema(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    resp = client.responses.create(
        model=DEFAULT_MODEL,
        temperature=0,
        max_output_tokens=60,
        store=False,
        input="Paris is the capital of France. Give the city and its country as JSON.",
        text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}},
    )
    value = json.loads(resp.output_text)
    assert set(value) == {"city", "country"}
    assert resp.text.format.type == "json_schema"


def test_background_response_is_polled_and_cancel(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model=DEFAULT_MODEL, temperature=0, max_output_tokens=20, input=QUESTION, background=True
    )
    assert resp.status in ("queued", "in_progress") and resp.background is True
    deadline = time.monotonic() + 120
    while resp.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.2)
        resp = client.responses.retrieve(resp.id)
    assert resp.status == "completed" and "Paris" in resp.output_text
    assert client.responses.cancel(resp.id).status == "completed"  # it already ended: no change
    long = client.responses.create(
        model=DEFAULT_MODEL, max_output_tokens=4000, input="Write a long story.", background=True
    )
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(long.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError):  # only background responses can be cancelled
        client.responses.cancel(client.responses.create(model=DEFAULT_MODEL, max_output_tokens=2, input="hi").id)


def test_background_stream_is_followed_again_after_a_disconnect(client: openai.OpenAI) -> None:
    stream = client.responses.create(
        model=DEFAULT_MODEL, temperature=0, max_output_tokens=40, input=QUESTION, background=True, stream=True
    )
    seen = []
    for event in stream:
        seen.append(event)
        if len(seen) == 5:
            break
    stream.close()  # the client goes away; the generation goes on
    rest = list(client.responses.retrieve(seen[0].response.id, stream=True, starting_after=4))
    events = seen + rest
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    deadline = time.monotonic() + 30
    while (final := client.responses.retrieve(seen[0].response.id)).status == "in_progress":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert final.output_text == text and "Paris" in text
    long = client.responses.create(
        model=DEFAULT_MODEL, max_output_tokens=4000, input="Write a long story.", background=True, stream=True
    )
    first = next(iter(long))
    assert client.responses.cancel(first.response.id).status == "cancelled"
    long.close()


def test_langchain_use_responses_api(base_url: str) -> None:
    llm = ChatOpenAI(
        base_url=f"{base_url}/v1",
        api_key="unused",
        model=DEFAULT_MODEL,
        temperature=0,
        max_tokens=40,
        max_retries=0,
        timeout=300,
        use_responses_api=True,
    )
    answer = llm.invoke(QUESTION)
    assert "Paris" in answer.text
    assert answer.usage_metadata["input_tokens"] > 0
    streamed = "".join(chunk.text for chunk in llm.stream(QUESTION))
    assert streamed == answer.text


def test_bad_inputs_are_400_in_openai_shape(base_url: str) -> None:
    url = f"{base_url}/v1/responses"
    cases = [
        ({"input": "hi"}, "model"),  # missing model
        ({"model": DEFAULT_MODEL, "input": 5}, "input"),  # wrong type
        ({"model": DEFAULT_MODEL, "input": [{"type": "input_image", "image_url": "http://x"}]}, "input"),
        ({"model": DEFAULT_MODEL}, "input"),  # no input at all
        ({"model": DEFAULT_MODEL, "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": DEFAULT_MODEL, "input": "hi", "temperature": "hot"}, "temperature"),
        (
            {
                "model": DEFAULT_MODEL,
                "input": "hi",
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "function", "name": "no_such_tool"},
            },
            "tool_choice",
        ),
        ({"model": DEFAULT_MODEL, "input": "hi", "tools": [{"type": "web_search"}]}, "tools"),
        ({"model": DEFAULT_MODEL, "input": "hi", "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"model": DEFAULT_MODEL, "input": "hi " * 9000}, "input"),  # beyond the context
        ({"model": DEFAULT_MODEL, "input": "hi", "max_output_tokens": 10**9}, "max_output_tokens"),
        ({"model": DEFAULT_MODEL, "input": "hi", "background": True, "store": False}, "background"),
        (
            {"model": DEFAULT_MODEL, "input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
            "text.format.schema",
        ),
    ]
    for body, param in cases:
        resp = httpx.post(url, json=body, timeout=60)
        assert resp.status_code == 400, (body, resp.text)
        error = resp.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"].startswith(param), (body, error)
    assert httpx.post(url, json={"model": "nope", "input": "hi"}).status_code == 404
    assert httpx.get(f"{url}/resp_missing").json()["error"]["type"] == "not_found_error"
    assert httpx.delete(f"{url}/resp_missing").status_code == 404


def endpoint_requests(server: ServerProcess, endpoint: str, status: str = "200") -> float:
    pattern = (
        rf'^switchyard_http_requests_total{{endpoint="{re.escape(endpoint)}",method="POST",status="{status}"}} (\S+)$'
    )
    match = re.search(pattern, httpx.get(f"{server.base_url}/metrics").text, re.M)
    return float(match.group(1)) if match else 0.0


def test_requests_count_by_endpoint_and_in_the_model_metrics(server: ServerProcess, client: openai.OpenAI) -> None:
    before = server.metric("switchyard_generation_tokens_total")
    by_endpoint = endpoint_requests(server, "/v1/responses")
    client.responses.create(model=DEFAULT_MODEL, max_output_tokens=2, input="hi", store=False)
    assert endpoint_requests(server, "/v1/responses") == by_endpoint + 1
    assert server.metric("switchyard_generation_tokens_total") > before  # through the same scheduler
