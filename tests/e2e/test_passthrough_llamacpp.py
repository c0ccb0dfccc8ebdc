"""The `openai` backend in front of llama.cpp's own servers, on SmolLM2's GGUF file: `llama-server` (found from
$SWITCHYARD_LLAMA_SERVER or bench/llamacpp_env.py's build) and llama-cpp-python's `python -m llama_cpp.server`
(from $SWITCHYARD_LLAMA_PYTHON's environment, when it has the `server` extra). Each is skipped when absent; the
answers through the gateway must equal the upstream's own."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import jsonschema
import openai
import pytest

from bench.gateway_server import Started, stop
from bench.llamacpp_bench import MODEL, shipped_gguf, start_llama_cpp_python_server, start_llama_server
from bench.llamacpp_env import find_llama_python, find_llama_server
from tests.conftest import ServerProcess
from tests.e2e.weather_tools import ASK, TIME, WEATHER

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0}  # the anthropic SDK takes sampling fields in the body
QUESTION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
]


@dataclass
class Upstream:
    kind: str  # llama-server or llama-cpp-python
    url: str


def _start(kind: str, log: Path) -> Started:
    if kind == "llama-server":
        binary = find_llama_server()
        if binary is None:
            pytest.skip("llama-server not found: set SWITCHYARD_LLAMA_SERVER (docs/benchmarks.md)")
        return start_llama_server(binary, shipped_gguf(), 2, 2, log)
    python = find_llama_python()
    if python is None:
        pytest.skip("llama-cpp-python not found: set SWITCHYARD_LLAMA_PYTHON (docs/testing.md)")
    if subprocess.run([str(python), "-c", "import llama_cpp.server.app"], capture_output=True).returncode != 0:
        pytest.skip(f"{python} has llama-cpp-python without its server extra")
    return start_llama_cpp_python_server(python, shipped_gguf(), 2, log)


@pytest.fixture(scope="module", params=["llama-server", "llama-cpp-python"])
def upstream(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    started = _start(request.param, tmp_path_factory.mktemp("llamacpp") / "upstream.log")
    try:
        yield Upstream(request.param, started.url.removesuffix("/v1"))  # llama-cpp-python's is read off /v1/models
    finally:
        stop(started.proc)


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("llamacpp_gateway")
    (repo / "llama-up").mkdir()
    (repo / "llama-up" / "config.yaml").write_text(
        f"backend: openai\nmax_model_len: 2048\nopenai:\n  base_url: {upstream.url}/v1\n  model: {MODEL}\n"
    )
    proc = ServerProcess(repo, startup_timeout=120)
    try:
        yield proc
    finally:
        proc.stop()


def _clients(upstream: Upstream, gateway: ServerProcess) -> tuple[openai.OpenAI, openai.OpenAI]:
    ours = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    theirs = openai.OpenAI(base_url=f"{upstream.url}/v1", api_key="unused", max_retries=0, timeout=120)
    return ours, theirs


def test_chat_and_completions_equal_the_upstreams_own(upstream: Upstream, gateway: ServerProcess) -> None:
    ours, theirs = _clients(upstream, gateway)
    mine = ours.chat.completions.create(model="llama-up", messages=QUESTION, temperature=0, max_tokens=10)
    direct = theirs.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=10)
    assert mine.model == "llama-up" and mine.choices[0].message.content == direct.choices[0].message.content
    assert mine.usage.completion_tokens == direct.usage.completion_tokens
    text = ours.completions.create(model="llama-up", prompt="Paris is", max_tokens=5, temperature=0).choices[0].text
    assert (
        text == theirs.completions.create(model=MODEL, prompt="Paris is", max_tokens=5, temperature=0).choices[0].text
    )


def test_streams_pass_through(upstream: Upstream, gateway: ServerProcess) -> None:
    ours, theirs = _clients(upstream, gateway)
    chunks = list(
        ours.chat.completions.create(
            model="llama-up",
            messages=QUESTION,
            temperature=0,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    direct = theirs.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=8)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == direct.choices[0].message.content
    if upstream.kind == "llama-server":  # llama-cpp-python 0.3 sends no usage chunk
        assert chunks[-1].usage.completion_tokens == direct.usage.completion_tokens


def test_llama_server_takes_tools_and_response_format(upstream: Upstream, gateway: ServerProcess) -> None:
    if upstream.kind != "llama-server":
        pytest.skip("llama-cpp-python's server has its own tool and schema dialects")
    ours, theirs = _clients(upstream, gateway)
    schema = {
        "type": "object",
        "properties": {"capital": {"enum": ["Paris", "Rome", "Berlin"]}},
        "required": ["capital"],
    }
    answer = ours.chat.completions.create(
        model="llama-up",
        messages=QUESTION,
        temperature=0,
        max_tokens=30,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    )
    jsonschema.validate(json.loads(answer.choices[0].message.content), schema)
    # what llama-server makes of tools with SmolLM2's template is its business: the gateway's answer must be its own
    ask = {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": "auto", "temperature": 0, "max_tokens": 16}
    mine = ours.chat.completions.create(model="llama-up", **ask).choices[0]
    direct = theirs.chat.completions.create(model=MODEL, **ask).choices[0]
    assert mine.finish_reason == direct.finish_reason and mine.message.content == direct.message.content
    assert [c.function for c in mine.message.tool_calls or []] == [c.function for c in direct.message.tool_calls or []]


def test_messages_and_responses_over_llama_cpp(upstream: Upstream, gateway: ServerProcess) -> None:
    ours, _ = _clients(upstream, gateway)
    chat = ours.chat.completions.create(model="llama-up", messages=QUESTION, temperature=0, max_tokens=10)
    claude = anthropic.Anthropic(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=120)
    message = claude.messages.create(
        model="llama-up",
        max_tokens=10,
        extra_body=GREEDY,
        system="Answer briefly.",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    assert message.content[0].text == chat.choices[0].message.content
    resp = ours.responses.create(
        model="llama-up",
        instructions="Answer briefly.",
        temperature=0,
        max_output_tokens=10,
        input="What is the capital of France?",
    )
    if upstream.kind == "llama-server":  # llama-cpp-python 0.3 ignores max_completion_tokens (Responses' cap)
        assert resp.output_text == chat.choices[0].message.content
    assert resp.output_text.startswith(chat.choices[0].message.content)
