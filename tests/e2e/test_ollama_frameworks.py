"""LangChain's ChatOllama (langchain-ollama) and LlamaIndex's Ollama (llama-index-llms-ollama) against the session's
real server through its Ollama API: the same greedy answer as /v1/chat/completions, streaming, a tool round trip and
structured output."""

from __future__ import annotations

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_ollama import ChatOllama
from llama_index.core.llms import ChatMessage
from llama_index.llms.ollama import Ollama
from pydantic import BaseModel

from tests.conftest import DEFAULT_MODEL

QUESTION = "What is the capital of France?"


class City(BaseModel):
    name: str
    country: str


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"22 degrees in {city}"


@pytest.fixture(scope="module")
def expected(base_url: str) -> str:
    body = {
        "model": DEFAULT_MODEL,
        "temperature": 0,
        "max_tokens": 24,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=300).json()["choices"][0]["message"][
        "content"
    ]


def test_langchain_chat_ollama(base_url: str, expected: str) -> None:
    llm = ChatOllama(model=DEFAULT_MODEL, base_url=base_url, temperature=0, num_predict=24)
    answer = llm.invoke(QUESTION)
    assert answer.content == expected and "Paris" in expected
    assert answer.usage_metadata["input_tokens"] > 0 and answer.usage_metadata["output_tokens"] > 0
    assert "".join(chunk.content for chunk in llm.stream(QUESTION)) == expected
    city = (
        ChatOllama(model=DEFAULT_MODEL, base_url=base_url, temperature=0, num_predict=60)
        .with_structured_output(City, method="json_schema")
        .invoke("Paris is the capital of France. Name the city and its country.")
    )
    assert isinstance(city, City) and city.name
    history = [
        HumanMessage("What is the weather in Paris?"),
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1"}]),
        ToolMessage("22 degrees celsius and sunny", tool_call_id="call_1"),
    ]
    reply = llm.bind_tools([get_weather]).invoke(history)  # SmolLM2 answers a tool result with another call
    assert reply.response_metadata["done_reason"] in ("stop", "length") and (reply.content or reply.tool_calls)
    assert all(c["name"] == "get_weather" and isinstance(c["args"], dict) for c in reply.tool_calls)


def test_llamaindex_ollama(base_url: str, expected: str) -> None:
    llm = Ollama(
        model=DEFAULT_MODEL,
        base_url=base_url,
        temperature=0,
        request_timeout=300,
        additional_kwargs={"num_predict": 24},
    )
    assert llm.complete(QUESTION).text == expected  # /api/generate: the prompt as a user message
    messages = [ChatMessage(role="user", content=QUESTION)]
    assert llm.chat(messages).message.content == expected
    assert "".join(r.delta for r in llm.stream_chat(messages)) == expected
