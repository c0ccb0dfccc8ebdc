"""response_format against the real server and the tiny default model: answers always parse and validate."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from tests.conftest import DEFAULT_MODEL

CASES = [
    (
        "Extract the person: Ada Lovelace is 36 years old.",
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
            "additionalProperties": False,
        },
    ),
    (
        "Classify the sentiment of: 'I love this product!'",
        {
            "type": "object",
            "properties": {
                "sentiment": {"enum": ["positive", "negative", "neutral"]},
                "confidence": {"type": "number"},
            },
            "required": ["sentiment", "confidence"],
        },
    ),
    (
        "Give the capital and the country: Paris is the capital of France.",
        {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "country": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "continent": {"enum": ["Europe", "Asia", "Africa", "America", "Oceania"]},
                    },
                    "required": ["name", "continent"],
                },
            },
            "required": ["city", "country"],
        },
    ),
    (
        "List three colors.",
        {
            "type": "object",
            "properties": {"colors": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 5}},
            "required": ["colors"],
        },
    ),
    (
        "Is the sky blue? Answer with a boolean and a reason.",
        {
            "type": "object",
            "properties": {"answer": {"type": "boolean"}, "reason": {"type": "string"}},
            "required": ["answer", "reason"],
        },
    ),
]
# Every string and list bounded: whatever is sampled, the answer ends within the token budget.
BOUNDED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "tags"],
}


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def http(base_url: str):
    with httpx.Client(base_url=base_url, timeout=300) as c:
        yield c


def _fmt(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


@pytest.mark.parametrize(("prompt", "schema"), CASES, ids=["person", "enum", "nested", "array", "boolean"])
def test_json_schema_answers_validate(client: openai.OpenAI, prompt: str, schema: dict) -> None:
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=200,
        response_format=_fmt(schema),
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), schema)


def test_sampled_answers_validate_too(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "Invent a user."}],
        temperature=1.0,
        seed=11,
        n=3,
        max_tokens=120,
        response_format=_fmt(BOUNDED),
    )
    assert len(resp.choices) == 3
    for choice in resp.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), BOUNDED)


def test_json_object(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "Describe Paris as a JSON object."}],
        temperature=0,
        max_tokens=60,
        response_format={"type": "json_object"},
    )
    content = resp.choices[0].message.content
    assert content.startswith("{")
    if resp.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


def test_streamed_answer_validates(client: openai.OpenAI) -> None:
    prompt, schema = CASES[2]
    chunks = list(
        client.chat.completions.create(
            model=DEFAULT_MODEL,
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            max_tokens=200,
            response_format=_fmt(schema),
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    jsonschema.validate(json.loads(text), schema)


def test_sdk_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    class Person(BaseModel):
        name: str
        age: int

    resp = client.chat.completions.parse(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": CASES[0][0]}],
        temperature=0,
        max_tokens=100,
        response_format=Person,
    )
    person = resp.choices[0].message.parsed
    assert isinstance(person, Person) and person.name


def test_max_tokens_cut_still_says_length(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": CASES[0][0]}],
        temperature=0,
        max_tokens=4,
        response_format=_fmt(CASES[0][1]),
    )
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 4
    assert resp.choices[0].message.content.startswith("{")


def test_completions_accept_response_format(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}
    resp = client.completions.create(
        model=DEFAULT_MODEL,
        prompt="Is Paris in France? Answer in JSON:",
        temperature=0,
        max_tokens=20,
        extra_body={"response_format": _fmt(schema)},
    )
    assert resp.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(resp.choices[0].text), schema)


def _deep_body(levels: int) -> bytes:
    schema = '{"type": "object", "properties": {"a": ' * levels + '{"type": "string"}' + "}}" * levels
    return (
        f'{{"model": "{DEFAULT_MODEL}", "messages": [{{"role": "user", "content": "hi"}}], "response_format": '
        f'{{"type": "json_schema", "json_schema": {{"name": "x", "schema": {schema}}}}}}}'
    ).encode()


@pytest.mark.parametrize("levels", [70, 10_000])
def test_deep_schemas_are_400(http: httpx.Client, levels: int) -> None:
    resp = http.post("/v1/chat/completions", content=_deep_body(levels), headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "response_format"


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        (_fmt({"$ref": "#"}), "response_format"),
        (_fmt({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}), "response_format"),
        (_fmt({"type": "strnig"}), "response_format"),
        (_fmt({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}), "response_format"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format"),
        (
            {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}},
            "response_format.json_schema.name",
        ),
        ({"type": "xml"}, "response_format.type"),
    ],
)
def test_bad_response_formats_are_400(http: httpx.Client, response_format: dict, param: str) -> None:
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "hi"}], "response_format": response_format}
    resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"


def test_min_tokens_cannot_combine_with_a_grammar(http: httpx.Client) -> None:
    body = {
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "min_tokens": 3,
        "response_format": {"type": "json_object"},
    }
    resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "min_tokens"
    assert http.get("/health").status_code == 200


@pytest.mark.parametrize(
    "extra",
    [
        {"structured_outputs": {"choice": ["yes", "no"]}},
        {"guided_choice": ["yes", "no"]},  # vLLM's older spelling
    ],
)
def test_vllm_choice(client: openai.OpenAI, extra: dict) -> None:
    messages = [{"role": "user", "content": "Is Paris in France?"}]
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=messages, temperature=0, max_tokens=10, extra_body=extra
    )
    assert resp.choices[0].message.content in ("yes", "no") and resp.choices[0].finish_reason == "stop"


def test_vllm_regex_and_json(client: openai.OpenAI) -> None:
    resp = client.completions.create(
        model=DEFAULT_MODEL,
        prompt="Call me at",
        temperature=0,
        max_tokens=20,
        extra_body={"structured_outputs": {"regex": r" [0-9]{3}-[0-9]{4}"}},
    )
    assert re.fullmatch(r" [0-9]{3}-[0-9]{4}", resp.choices[0].text)
    prompt, schema = CASES[0]
    for extra in ({"structured_outputs": {"json": schema}}, {"guided_json": json.dumps(schema)}):
        resp = client.chat.completions.create(
            model=DEFAULT_MODEL,
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            max_tokens=100,
            extra_body=extra,
        )
        jsonschema.validate(json.loads(resp.choices[0].message.content), schema)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"structured_outputs": {"regex": "(a"}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs"),
        ({"structured_outputs": {"grammar": "start: nowhere"}}, "structured_outputs"),
        ({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}}, "structured_outputs"),
        ({"structured_outputs": {"choice": ["a"]}, "guided_regex": "b"}, "structured_outputs"),
        ({"guided_regex": "x" * 5000}, "guided_regex"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_bad_structured_outputs_are_400(http: httpx.Client, extra: dict, param: str) -> None:
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, **extra}
    resp = http.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
