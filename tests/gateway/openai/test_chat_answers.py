"""A chat answer read into OpenAI's message and stream chunks: reasoning split off first, then tool calls, whole and
streamed a character at a time, with the same result."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from engines.types import GenerationOutput
from gateway.llm.reasoning import PARSERS as REASONING
from gateway.llm.reasoning import Reasoning
from gateway.llm.tool_parsers import PARSERS
from gateway.openai.chat import _chunks, _message
from gateway.openai.protocol import ChatCompletionRequest
from gateway.openai.results import CollectedChoice
from gateway.openai.tools import ToolPlan

TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    },
}
QWEN3 = Reasoning(REASONING["qwen3"], starts_open=False)
ANSWER = (
    "<think>\nThe user wants the time.\n</think>\n\n<tool_call>\n"
    '{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'
)


def _plan(choice: str = "auto", dialect: str = "hermes") -> ToolPlan:
    return ToolPlan(choice, [TIME], PARSERS[dialect], forced=[TIME])


def _streamed(text: str, plan: ToolPlan, reasoning: Reasoning | None, finish: str) -> dict:
    """Feed `text` a character at a time through the chunk stream; rebuild the message the openai SDK would."""
    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    )
    model = SimpleNamespace(name="m", scheduler=SimpleNamespace(tokenizer=None))

    async def outputs():
        for i, ch in enumerate(text):
            last = i == len(text) - 1
            yield 0, GenerationOutput("r", [i], ch, finished=last, finish_reason=finish if last else None)

    async def run() -> list[dict]:
        return [c async for c in _chunks(model, req, plan, reasoning, outputs(), 3, False)]

    message: dict = {"reasoning_content": "", "reasoning": "", "content": "", "tool_calls": {}}
    finishes = []
    for chunk in asyncio.run(run()):
        for choice in chunk["choices"]:
            delta = choice["delta"]
            for key in ("reasoning_content", "reasoning", "content"):
                message[key] += delta.get(key) or ""
            for call in delta.get("tool_calls") or []:
                if "id" in call:
                    message["tool_calls"][call["index"]] = [call["function"]["name"], ""]
                message["tool_calls"][call["index"]][1] += call["function"]["arguments"]
            finishes += [choice["finish_reason"]] if choice["finish_reason"] else []
    message["finish_reason"] = finishes
    return message


def test_reasoning_then_a_call() -> None:
    message, finish = _message(CollectedChoice(ANSWER, "stop"), _plan(), QWEN3)
    assert finish == "tool_calls"
    assert message["reasoning_content"] == message["reasoning"] == "\nThe user wants the time.\n"
    assert message["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("get_time", {"tz": "CET"})
    ]
    streamed = _streamed(ANSWER, _plan(), QWEN3, "stop")
    assert streamed["reasoning_content"] == streamed["reasoning"] == message["reasoning_content"]
    assert streamed["content"] == "" and streamed["finish_reason"] == ["tool_calls"]
    assert [(n, json.loads(a)) for n, a in streamed["tool_calls"].values()] == [("get_time", {"tz": "CET"})]


def test_reasoning_then_an_answer() -> None:
    text = "<think>Easy.</think>\n\nIt is noon."
    message, finish = _message(CollectedChoice(text, "stop"), ToolPlan("none"), QWEN3)
    assert (message["reasoning_content"], message["content"], finish) == ("Easy.", "It is noon.", "stop")
    streamed = _streamed(text, ToolPlan("none"), QWEN3, "stop")
    assert (streamed["reasoning_content"], streamed["content"]) == ("Easy.", "It is noon.")
    # no reasoning parser: the text is the answer, tags and all
    assert _message(CollectedChoice(text, "stop"), ToolPlan("none"), None)[0] == {"role": "assistant", "content": text}


def test_gpt_oss_reasoning_and_a_call() -> None:
    harmony = Reasoning(REASONING["openai_gptoss"], starts_open=False)
    text = (
        "<|channel|>analysis<|message|>Needs the time.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_time <|constrain|>json<|message|>{"tz": "CET"}'
    )
    message, finish = _message(CollectedChoice(text, "stop"), _plan(), harmony)
    assert (message["reasoning_content"], message["content"], finish) == ("Needs the time.", None, "tool_calls")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("get_time", {"tz": "CET"})
    ]
    streamed = _streamed(text, _plan(), harmony, "stop")
    assert (streamed["reasoning_content"], streamed["content"]) == ("Needs the time.", "")
    assert [(n, json.loads(a)) for n, a in streamed["tool_calls"].values()] == [("get_time", {"tz": "CET"})]


@pytest.mark.parametrize("dialect", sorted(PARSERS))
def test_forced_call_cut_by_max_tokens_is_a_partial_call(dialect: str) -> None:
    whole = PARSERS[dialect].render_calls([{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}])
    if dialect in ("mistral", "phi4_mini_json"):  # their grammars leave out the special-token markers
        whole = whole[whole.index("[") :].removesuffix("<|/tool_call|>")
    cut = whole[: whole.index("Paris")]
    message, finish = _message(CollectedChoice(cut, "length"), _plan("named", dialect), None)
    assert finish == "length" and message["content"] is None
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "get_time" and call["function"]["arguments"].endswith('"Europe/')
    streamed = _streamed(cut, _plan("named", dialect), None, "length")
    assert streamed["content"] == "" and streamed["finish_reason"] == ["length"]
    assert list(streamed["tool_calls"].values()) == [["get_time", call["function"]["arguments"]]]
