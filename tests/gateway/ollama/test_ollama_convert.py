"""Ollama chat/generate -> the OpenAI path's requests: messages, tool calls and results, options, format, think."""

from __future__ import annotations

import pytest

from gateway.errors import InvalidRequestError
from gateway.ollama.convert import chat_messages, chat_request, generate_request, response_format, template_kwargs
from gateway.ollama.protocol import ChatRequest, GenerateRequest
from gateway.openai.protocol import ChatCompletionRequest, CompletionRequest

HELLO = [{"role": "user", "content": "hi"}]


def _chat(**fields) -> ChatRequest:  # noqa: ANN003
    return ChatRequest.model_validate({"model": "m", "messages": HELLO, **fields})


def _generate(**fields) -> GenerateRequest:  # noqa: ANN003
    return GenerateRequest.model_validate({"model": "m", "prompt": "Say hi", **fields})


def test_tool_calls_get_ids_and_results_answer_them_by_tool_name() -> None:
    req = _chat(
        messages=[
            {"role": "USER", "content": "weather and time in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"function": {"name": "time", "arguments": {"city": "Paris"}}},
                    {"function": {"name": "weather", "arguments": {"city": "Paris"}}},
                ],
            },
            {"role": "tool", "tool_name": "weather", "content": "sunny"},
            {"role": "tool", "content": "noon"},  # no name: the earliest call still unanswered
            {"role": "tool", "tool_name": "time", "tool_call_id": "mine", "content": "late"},
        ]
    )
    assert chat_messages(req.messages, "m") == [
        {"role": "user", "content": "weather and time in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1_0", "type": "function", "function": {"name": "time", "arguments": '{"city": "Paris"}'}},
                {
                    "id": "call_1_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                },
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1_1", "name": "weather"},
        {"role": "tool", "content": "noon", "tool_call_id": "call_1_0"},
        {"role": "tool", "content": "late", "tool_call_id": "mine", "name": "time"},
    ]


def test_images_are_refused_naming_the_model() -> None:
    req = _chat(messages=[{"role": "user", "content": "what is this?", "images": ["aGVsbG8="]}])
    with pytest.raises(InvalidRequestError, match='"m" does not support images') as info:
        chat_messages(req.messages, "m")
    assert info.value.param == "messages.0.images" and info.value.status == 400
    with pytest.raises(InvalidRequestError, match="does not support images"):
        generate_request(_generate(images=["aGVsbG8="]), "m", 2048, False)


def test_format_is_json_object_or_a_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert response_format("json") == {"type": "json_object"}
    assert response_format(schema) == {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    assert response_format("") is None and response_format(None) is None
    with pytest.raises(InvalidRequestError, match='"yaml" is not a format'):
        response_format("yaml")
    chat = chat_request(_chat(format=schema), "m", 2048, False)
    assert chat.response_format is not None and chat.response_format.json_schema.schema_ == schema


def test_think_needs_a_model_that_reasons() -> None:
    with pytest.raises(InvalidRequestError, match='"m" does not support thinking'):
        template_kwargs(_chat(think=True), "m", thinks=False)
    assert template_kwargs(_chat(think=False), "m", thinks=False) is None
    assert template_kwargs(_chat(), "m", thinks=True) is None  # the template's default
    assert template_kwargs(_chat(think=False), "m", thinks=True) == {"enable_thinking": False}
    assert template_kwargs(_chat(think="high"), "m", thinks=True) == {
        "enable_thinking": True,
        "reasoning_effort": "high",
    }


def test_options_become_sampling_fields() -> None:
    chat = chat_request(
        _chat(
            options={
                "temperature": 0,
                "top_p": 0.5,
                "top_k": 7,
                "seed": 42,
                "num_predict": 9,
                "stop": ["\n\n", "END"],
                "repeat_penalty": 1.2,
                "presence_penalty": 0.5,
                "frequency_penalty": -0.5,
                "min_p": 0.1,
                "num_ctx": 4096,
                "mirostat": 0,
                "num_gpu": 1,
            }
        ),
        "served",
        8192,
        False,
    )
    assert isinstance(chat, ChatCompletionRequest) and chat.model == "served" and chat.stream
    assert (chat.temperature, chat.top_p, chat.top_k, chat.seed, chat.max_tokens, chat.stop) == (
        0,
        0.5,
        7,
        42,
        9,
        ["\n\n", "END"],
    )
    assert (chat.repetition_penalty, chat.presence_penalty, chat.frequency_penalty, chat.min_p) == (1.2, 0.5, -0.5, 0.1)
    plain = chat_request(_chat(options={"seed": -1, "num_predict": -1}), "m", 8192, False)
    assert plain.seed is None and plain.max_tokens is None and plain.temperature is None


@pytest.mark.parametrize(
    ("options", "where"),
    [
        ({"temperature": "hot"}, "options.temperature"),
        ({"temperature": 3}, "options.temperature"),
        ({"num_predict": 0}, "options.num_predict"),
        ({"num_predict": -3}, "options.num_predict"),
        ({"num_ctx": 0}, "options.num_ctx"),
        ({"stop": [""]}, "options.stop"),
        ({"top_k": -1}, "options.top_k"),
    ],
)
def test_bad_options_are_400s_naming_the_option(options: dict, where: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        chat_request(_chat(options=options), "m", 8192, False)
    assert info.value.param == where and info.value.message.startswith(where)


def test_generate_is_a_chat_of_system_and_prompt() -> None:
    req = generate_request(_generate(system="Be brief."), "m", 2048, False)
    assert isinstance(req, ChatCompletionRequest)
    assert [(m.role, m.content) for m in req.messages] == [("system", "Be brief."), ("user", "Say hi")]


def test_raw_and_templated_prompts_go_to_completions() -> None:
    raw = generate_request(_generate(raw=True, options={"num_predict": 5}), "m", 2048, False)
    assert isinstance(raw, CompletionRequest) and raw.prompt == "Say hi" and raw.max_tokens == 5
    free = generate_request(_generate(raw=True), "m", 2048, False)
    assert free.max_tokens is None  # not completions' default of 16: until the context is full, as on Ollama
    templated = generate_request(
        _generate(system="S", template="{{ if .System }}[{{ .System }}]{{ end }}<u>{{ .Prompt }}</u>"), "m", 2048, False
    )
    assert isinstance(templated, CompletionRequest) and templated.prompt == "[S]<u>Say hi</u>"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"raw": True, "system": "S"}, "raw mode does not support template, system, or context"),
        ({"suffix": "end"}, '"m" does not support insert'),
        ({"context": [1, 2]}, "context"),
        ({"logprobs": True}, "logprobs"),
        ({"format": 3}, "format"),
    ],
)
def test_generate_refusals(fields: dict, message: str) -> None:
    with pytest.raises((InvalidRequestError, ValueError), match=message):
        generate_request(_generate(**fields), "m", 2048, False)
