"""LlamaIndex's OpenAILike against the real server: chat models (/v1/chat/completions) and completion models."""

from __future__ import annotations

import pytest
from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike

from tests.conftest import DEFAULT_MODEL

QUESTION = [ChatMessage(role="user", content="What is the capital of France?")]


def _llm(base_url: str, chat: bool, max_tokens: int) -> OpenAILike:
    return OpenAILike(
        model=DEFAULT_MODEL,
        api_base=f"{base_url}/v1",
        api_key="unused",
        is_chat_model=chat,
        context_window=8192,
        temperature=0,
        max_tokens=max_tokens,
        max_retries=0,
        timeout=300,
    )


@pytest.fixture(scope="module")
def chat_llm(base_url: str) -> OpenAILike:
    return _llm(base_url, True, 60)


def test_chat_and_stream_chat(chat_llm: OpenAILike) -> None:
    answer = chat_llm.chat(QUESTION)
    assert "Paris" in answer.message.content
    streamed = "".join(r.delta for r in chat_llm.stream_chat(QUESTION))
    assert streamed == answer.message.content


async def test_async_chat(chat_llm: OpenAILike) -> None:
    answer = await chat_llm.achat(QUESTION)
    assert "Paris" in answer.message.content


def test_complete_on_a_completion_model(base_url: str) -> None:
    llm = _llm(base_url, False, 8)
    text = llm.complete("The capital of France is").text
    assert "Paris" in text
    assert "".join(r.delta for r in llm.stream_complete("The capital of France is")) == text
