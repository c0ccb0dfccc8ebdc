"""langchain-openai's ChatOpenAI against the real server: invoke, stream, structured output, tools."""

from __future__ import annotations

import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from tests.conftest import DEFAULT_MODEL

QUESTION = "What is the capital of France?"


class City(BaseModel):
    name: str
    country: str


@tool
def get_weather(city: str, unit: str) -> str:
    """Current weather for a city; unit is celsius or fahrenheit."""
    return f"22 {unit} in {city}"


@pytest.fixture(scope="module")
def llm(base_url: str) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{base_url}/v1",
        api_key="unused",
        model=DEFAULT_MODEL,
        temperature=0,
        max_tokens=60,
        max_retries=0,
        timeout=300,
    )


def test_invoke_and_stream(llm: ChatOpenAI) -> None:
    answer = llm.invoke(QUESTION)
    assert "Paris" in answer.content
    assert answer.response_metadata["finish_reason"] == "stop"
    assert answer.usage_metadata["input_tokens"] > 0
    chunks = list(llm.stream(QUESTION))
    assert "".join(c.content for c in chunks) == answer.content


def test_stream_usage_when_asked(base_url: str) -> None:
    llm = ChatOpenAI(
        base_url=f"{base_url}/v1",
        api_key="unused",
        model=DEFAULT_MODEL,
        temperature=0,
        max_tokens=5,
        stream_usage=True,
        max_retries=0,
        timeout=300,
    )
    total = None
    for chunk in llm.stream(QUESTION):
        total = chunk if total is None else total + chunk
    assert total.usage_metadata["output_tokens"] == 5


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output(llm: ChatOpenAI, method: str) -> None:
    structured = llm.with_structured_output(City, method=method)
    city = structured.invoke("Paris is the capital of France. Name the city and its country.")
    assert isinstance(city, City) and city.name


def test_bind_tools_gives_a_tool_call(llm: ChatOpenAI) -> None:
    for choice in ("get_weather", "any"):
        message = llm.bind_tools([get_weather], tool_choice=choice).invoke("What is the weather in Paris?")
        assert [c["name"] for c in message.tool_calls] == ["get_weather"] * len(message.tool_calls)
        assert message.tool_calls and set(message.tool_calls[0]["args"]) == {"city", "unit"}
        assert message.tool_calls[0]["id"].startswith("call_")


def test_streamed_tool_call_chunks_merge(llm: ChatOpenAI) -> None:
    bound = llm.bind_tools([get_weather], tool_choice="get_weather")
    total = None
    for chunk in bound.stream("What is the weather in Paris?"):
        total = chunk if total is None else total + chunk
    assert len(total.tool_calls) == 1 and total.tool_calls[0]["name"] == "get_weather"
    assert set(total.tool_calls[0]["args"]) == {"city", "unit"}
    assert not total.invalid_tool_calls
