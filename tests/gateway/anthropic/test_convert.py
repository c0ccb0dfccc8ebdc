"""Messages -> chat: content blocks, tool results checked against the calls before them, stop sequences."""

from __future__ import annotations

import pytest

from gateway.anthropic.convert import chat_messages, chat_request, cut_stop, stop_reason
from gateway.anthropic.protocol import MessagesRequest
from gateway.errors import InvalidRequestError


def _request(messages: list, **fields) -> MessagesRequest:  # noqa: ANN003
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 8, "messages": messages, **fields})


def test_blocks_become_chat_messages() -> None:
    req = _request(
        [
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"c": "P"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {"type": "text", "text": "thanks"},
                ],
            },
        ],
        system=[{"type": "text", "text": "Be brief."}],
    )
    assert chat_messages(req) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "w", "arguments": '{"c": "P"}'}}],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "user", "content": "thanks"},
    ]


def test_tool_result_for_an_unknown_call_and_prefill_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="toolu_x"):
        chat_messages(
            _request([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"}]}])
        )
    with pytest.raises(InvalidRequestError, match="prefill"):
        chat_messages(_request([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]))


def test_tool_choice_and_sampling_fields_map_to_chat() -> None:
    tool = {"name": "w", "input_schema": {"type": "object"}}
    chat = chat_request(
        _request(
            [{"role": "user", "content": "hi"}],
            tools=[tool],
            temperature=0.5,
            top_k=5,
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            stop_sequences=["END"],
            metadata={"user_id": "u1"},
        )
    )
    assert chat.tool_choice == "required" and chat.parallel_tool_calls is False
    assert chat.temperature == 0.5 and chat.top_k == 5 and chat.max_tokens == 8 and chat.user == "u1"
    assert chat.stop == ["END"] and chat.include_stop_str_in_output  # kept, to say which one matched
    with pytest.raises(InvalidRequestError, match="not in tools"):
        chat_request(
            _request([{"role": "user", "content": "hi"}], tools=[tool], tool_choice={"type": "tool", "name": "other"})
        )


def test_stop_sequence_is_cut_and_named() -> None:
    assert cut_stop("Hello END", "stop", ["X", "END"]) == ("Hello ", "END")
    assert cut_stop("Hello END", "length", ["END"]) == ("Hello END", None)
    assert stop_reason("stop", "END", False) == "stop_sequence"
    assert stop_reason("stop", None, True) == "tool_use"
    assert stop_reason("length", None, False) == "max_tokens"
    assert stop_reason("stop", None, False) == "end_turn"
