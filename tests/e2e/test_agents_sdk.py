"""The OpenAI Agents SDK runs a small agent with one function tool against the server's /v1/responses.

The SDK needs openai 3.x, which llama-index's openai<3 excludes from the main venv, so this runs in its own venv
(`.ci/run` builds it) against a server started with the main venv's Python (SWITCHYARD_TEST_SERVER_PYTHON); the
main run skips it when the SDK is missing.
"""

from __future__ import annotations

import os

import pytest

agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK runs in its own venv (see .ci/run)")

from openai import AsyncOpenAI  # noqa: E402

from tests.conftest import DEFAULT_MODEL  # noqa: E402

pytestmark = pytest.mark.agents

os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"  # tracing would send spans to OpenAI
agents.set_tracing_disabled(True)

CITIES: list[str] = []


@agents.function_tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    CITIES.append(city)
    return f"22 degrees celsius and sunny in {city}"


def _model(base_url: str) -> agents.OpenAIResponsesModel:
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    return agents.OpenAIResponsesModel(model=DEFAULT_MODEL, openai_client=client)


def test_agent_calls_its_function_tool(base_url: str) -> None:
    # The 135M model keeps calling a tool it may call, so the run ends on the tool's output (the SDK's
    # stop_on_first_tool); the call itself is chosen, parsed and run through /v1/responses.
    agent = agents.Agent(
        name="weather",
        instructions="You answer questions about the weather with the get_weather tool.",
        tools=[get_weather],
        model=_model(base_url),
        tool_use_behavior="stop_on_first_tool",
        model_settings=agents.ModelSettings(
            temperature=0, max_tokens=80, tool_choice="required", parallel_tool_calls=False
        ),
    )
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?", max_turns=3)
    assert CITIES and "paris" in CITIES[0].lower()
    assert result.final_output == f"22 degrees celsius and sunny in {CITIES[0]}"
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item"]


def test_agent_answers_in_text(base_url: str) -> None:
    agent = agents.Agent(
        name="geography", model=_model(base_url), model_settings=agents.ModelSettings(temperature=0, max_tokens=100)
    )
    result = agents.Runner.run_sync(agent, "What is the capital of France?", max_turns=1)
    assert "Paris" in result.final_output
    assert [item.type for item in result.new_items] == ["message_output_item"]
