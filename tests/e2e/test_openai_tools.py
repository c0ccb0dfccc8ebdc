"""Tool calling against the real server: constrained calls validate, streams follow the reference's delta rules."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests.conftest import DEFAULT_MODEL
from tests.e2e.weather_tools import ASK, TIME, WEATHER

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def http(base_url: str):
    with httpx.Client(base_url=base_url, timeout=300) as c:
        yield c


def _check_calls(calls) -> list[tuple[str, dict]]:
    out = []
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        out.append((call.function.name, args))
    return out


def test_required_gives_schema_valid_calls(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", temperature=0, max_tokens=200
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = _check_calls(choice.message.tool_calls)
    assert 1 <= len(calls) and len({c.id for c in choice.message.tool_calls}) == len(calls)


def test_named_choice_calls_that_function_once(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=ASK,
        tools=[WEATHER, TIME],
        temperature=0,
        max_tokens=200,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    calls = _check_calls(resp.choices[0].message.tool_calls)
    assert [name for name, _ in calls] == ["get_time"]
    assert resp.choices[0].finish_reason == "tool_calls"


def test_parallel_tool_calls_false_gives_one_call(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=200,
    )
    assert len(_check_calls(resp.choices[0].message.tool_calls)) == 1


def test_sampled_calls_validate_too(client: openai.OpenAI) -> None:
    # bounded arguments: whatever is sampled at temperature 1, the call ends well within max_tokens
    bounded = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    }
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=ASK,
        tools=[bounded],
        n=3,
        seed=5,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        max_tokens=250,
    )
    for choice in resp.choices:
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), bounded["function"]["parameters"])


def test_stream_deltas_follow_the_reference(http: httpx.Client, client: openai.OpenAI) -> None:
    body = {
        "model": DEFAULT_MODEL,
        "messages": ASK,
        "tools": [WEATHER, TIME],
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 200,
        "stream": True,
    }
    deltas, finishes, ids = [], [], set()
    with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            ids.add(chunk["id"])
            for choice in chunk["choices"]:
                deltas += choice["delta"].get("tool_calls") or []
                if choice["finish_reason"]:
                    finishes.append(choice["finish_reason"])
    assert finishes == ["tool_calls"] and len(ids) == 1
    calls: dict[int, dict] = {}
    for d in deltas:
        assert isinstance(d["index"], int)
        if d["index"] not in calls:  # first delta of a call: id, type and name
            assert d["id"].startswith("call_") and d["type"] == "function" and d["function"]["name"] in SCHEMAS
            calls[d["index"]] = {"name": d["function"]["name"], "arguments": d["function"].get("arguments", "")}
        else:
            assert "id" not in d and "name" not in d["function"]
            assert isinstance(d["function"]["arguments"], str)
            calls[d["index"]]["arguments"] += d["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls))) and calls
    streamed = [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())]
    for name, args in streamed:
        jsonschema.validate(args, SCHEMAS[name])
    whole = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", temperature=0, max_tokens=200
    )
    calls = whole.choices[0].message.tool_calls
    assert streamed == [(c.function.name, json.loads(c.function.arguments)) for c in calls]


def test_sdk_stream_accumulates_the_call(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=200,
        stream=True,
    )
    name, args = None, ""
    for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            name = name or tc.function.name
            args += tc.function.arguments or ""
    assert name == "get_weather"
    jsonschema.validate(json.loads(args), SCHEMAS["get_weather"])


def test_tool_choice_none_answers_in_text(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=ASK, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=30
    )
    assert resp.choices[0].message.tool_calls is None and resp.choices[0].message.content
    assert resp.choices[0].finish_reason in ("stop", "length")


def test_auto_answers_are_well_formed(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=60
    )
    message = resp.choices[0].message
    if message.tool_calls:
        _check_calls(message.tool_calls)
        assert resp.choices[0].finish_reason == "tool_calls"
    else:
        assert message.content and resp.choices[0].finish_reason in ("stop", "length")


def test_tool_results_round_trip(client: openai.OpenAI, http: httpx.Client) -> None:
    first = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=ASK[:1],
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=200,
    )
    call = first.choices[0].message.tool_calls[0]
    messages = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "22 degrees and sunny"},
    ]
    final = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=messages, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=40
    )
    assert final.choices[0].message.content
    # the prompt the model saw holds the call it made and the result it got
    tokens = http.post("/tokenize", json={"model": DEFAULT_MODEL, "messages": messages}).json()
    assert tokens["count"] == final.usage.prompt_tokens
    prompt = http.post("/detokenize", json={"model": DEFAULT_MODEL, "tokens": tokens["tokens"]}).json()["prompt"]
    assert '"name": "get_weather"' in prompt and "22 degrees and sunny" in prompt


@pytest.mark.parametrize(
    ("tools", "tool_choice", "param"),
    [
        ([{"type": "function", "function": {"name": "f", "parameters": {"type": "strnig"}}}], "auto", "tools"),
        ([{"type": "function", "function": {"name": "f", "parameters": {"properties": 5}}}], "required", "tools"),
        ([{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}], "required", "tools"),
        ([{"type": "function", "function": {"name": "f", "parameters": {"not": {}}}}], "required", "tools"),
        ([WEATHER, WEATHER], "auto", "tools"),
        ([{"type": "function", "function": {"name": "bad name!"}}], "auto", "tools.0.function.name"),
        ([{"type": "function"}], "auto", "tools.0.function"),
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
        ([], "required", "tool_choice"),
        ([WEATHER], "sometimes", "tool_choice"),
    ],
)
def test_bad_tools_are_400(http: httpx.Client, tools: list, tool_choice, param: str) -> None:
    body = {"model": DEFAULT_MODEL, "messages": ASK, "tools": tools, "tool_choice": tool_choice}
    resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_deep_tool_schema_is_400(http: httpx.Client) -> None:
    params = '{"type": "object", "properties": {"a": ' * 3000 + "{}" + "}}" * 3000
    raw = (
        f'{{"model": "{DEFAULT_MODEL}", "messages": [{{"role": "user", "content": "hi"}}], '
        f'"tools": [{{"type": "function", "function": {{"name": "f", "parameters": {params}}}}}]}}'
    )
    resp = http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "tools"
