"""Ollama's API through the official `ollama` client (and LangChain's ChatOllama, LlamaIndex's Ollama) against a real
server of SmolLM2 and MiniLM: chat, stream, generate, embed, list, show, ps, tools, format, errors, API keys and
keep_alive. One server for the module, in the explicit model control mode with an admin key, so that keep_alive 0
can unload (the last tests) without touching the session's server."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator

import httpx
import numpy as np
import ollama
import pytest

from tests.conftest import DEFAULT_MODEL, ROOT, ServerProcess, smollm2_config

EMBEDDER = "all-minilm-l6-v2"
USER_KEY = "sk-ollama-user-0123456789"
ADMIN_KEY = "sk-ollama-admin-0123456789"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 24}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("ollama_repository")
    (repo / DEFAULT_MODEL).mkdir()
    (repo / DEFAULT_MODEL / "config.yaml").write_text(smollm2_config(4096))
    shutil.copytree(ROOT / "model_repository" / EMBEDDER, repo / EMBEDDER)
    keys = tmp_path_factory.mktemp("ollama_keys")
    (keys / "api").write_text(USER_KEY + "\n")
    (keys / "admin").write_text(ADMIN_KEY + "\n")
    proc = ServerProcess(
        repo,
        "--api-key-file",
        str(keys / "api"),
        "--admin-key-file",
        str(keys / "admin"),
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
    )
    try:
        yield proc
    finally:
        proc.stop()


def _client(server: ServerProcess, key: str = USER_KEY) -> ollama.Client:
    return ollama.Client(host=server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=300)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> ollama.Client:
    return _client(server)


def _openai(server: ServerProcess, path: str, body: dict) -> dict:
    r = httpx.post(
        f"{server.base_url}/v1/{path}", json=body, timeout=300, headers={"Authorization": f"Bearer {USER_KEY}"}
    )
    r.raise_for_status()
    return r.json()


def test_list_show_ps_and_version(client: ollama.Client, server: ServerProcess) -> None:
    models = {m.model: m for m in client.list().models}
    assert set(models) == {DEFAULT_MODEL, EMBEDDER}
    llm = models[DEFAULT_MODEL]
    assert (llm.details.format, llm.details.family, llm.details.quantization_level) == ("gguf", "llama", "Q4_1")
    assert llm.details.parameter_size.endswith("M") and llm.size > 50e6 and len(llm.digest) == 64
    assert models[EMBEDDER].details.format == "safetensors"
    shown = client.show(DEFAULT_MODEL)
    assert shown.capabilities == ["completion", "tools"]  # SmolLM2 has no reasoning parser, nor vision
    assert shown.modelinfo["general.architecture"] == "llama" and "<|im_start|>" in shown.template
    assert "num_ctx" in shown.parameters and shown.modelfile.count("FROM ") == 1
    assert client.show(f"{EMBEDDER}:latest").capabilities == ["embedding"]
    running = {m.model: m for m in client.ps().models}
    assert set(running) == {DEFAULT_MODEL, EMBEDDER}
    assert running[DEFAULT_MODEL].context_length == 2048 and running[DEFAULT_MODEL].expires_at.year > 2300
    assert httpx.get(f"{server.base_url}/api/version", headers={"Authorization": f"Bearer {USER_KEY}"}).json()[
        "version"
    ]


def test_chat_answers_as_the_openai_endpoint(client: ollama.Client, server: ServerProcess) -> None:
    chat = _openai(
        server, "chat/completions", {"model": DEFAULT_MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 24}
    )
    answer = client.chat(model=DEFAULT_MODEL, messages=QUESTION, options=GREEDY)
    assert answer.message.content == chat["choices"][0]["message"]["content"] and "Paris" in answer.message.content
    assert answer.message.role == "assistant" and answer.done and answer.done_reason in ("stop", "length")
    assert answer.prompt_eval_count == chat["usage"]["prompt_tokens"]
    assert answer.eval_count == chat["usage"]["completion_tokens"]
    assert 0 < answer.prompt_eval_duration < answer.total_duration and answer.eval_duration > 0
    chunks = list(client.chat(model=DEFAULT_MODEL, messages=QUESTION, options=GREEDY, stream=True))
    assert "".join(c.message.content for c in chunks) == answer.message.content
    assert [c.done for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].eval_count == answer.eval_count and chunks[-1].done_reason == answer.done_reason


def test_generate_answers_as_chat_and_raw_as_completions(client: ollama.Client, server: ServerProcess) -> None:
    chat = client.chat(model=DEFAULT_MODEL, messages=QUESTION, options=GREEDY)
    generated = client.generate(model=DEFAULT_MODEL, prompt=QUESTION[0]["content"], options=GREEDY)
    assert generated.response == chat.message.content and generated.done
    streamed = "".join(
        c.response
        for c in client.generate(model=DEFAULT_MODEL, prompt=QUESTION[0]["content"], options=GREEDY, stream=True)
    )
    assert streamed == generated.response
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    completion = _openai(
        server, "completions", {"model": DEFAULT_MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 12}
    )
    raw = client.generate(model=DEFAULT_MODEL, prompt=prompt, raw=True, options={"temperature": 0, "num_predict": 12})
    assert raw.response == completion["choices"][0]["text"]
    assert raw.eval_count == completion["usage"]["completion_tokens"]
    templated = client.generate(
        model=DEFAULT_MODEL,
        prompt=QUESTION[0]["content"],
        options={"temperature": 0, "num_predict": 12},
        template="<|im_start|>user\n{{ .Prompt }}<|im_end|>\n<|im_start|>assistant\n",
    )
    assert templated.response == raw.response


def test_options_stop_and_limits(client: ollama.Client) -> None:
    full = client.chat(model=DEFAULT_MODEL, messages=QUESTION, options=GREEDY).message.content
    word = full.split()[2]
    cut = client.chat(model=DEFAULT_MODEL, messages=QUESTION, options={**GREEDY, "stop": [word]})
    assert cut.message.content == full[: full.index(word)] and cut.done_reason == "stop"
    short = client.chat(model=DEFAULT_MODEL, messages=QUESTION, options={"temperature": 0, "num_predict": 3})
    assert short.eval_count == 3 and short.done_reason == "length"


def test_format_json_and_schema(client: ollama.Client) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"],
    }
    ask = [{"role": "user", "content": "Name the capital of France and its country as JSON."}]
    answer = client.chat(
        model=DEFAULT_MODEL, messages=ask, format=schema, options={"temperature": 0, "num_predict": 60}
    )
    value = json.loads(answer.message.content)
    assert set(value) == {"city", "country"} and all(isinstance(v, str) for v in value.values())
    loose = client.generate(
        model=DEFAULT_MODEL, prompt=ask[0]["content"], format="json", options={"temperature": 0, "num_predict": 60}
    )
    assert isinstance(json.loads(loose.response), dict)


def test_tool_round_trip_renders_as_the_openai_endpoint(client: ollama.Client, server: ServerProcess) -> None:
    """Ollama's call (no id, arguments as an object) and result (by tool name) reach the chat template as the
    OpenAI messages they stand for: the same prompt and the same greedy answer, its calls in Ollama's shape.
    (SmolLM2 does not call tools on a plain question unless forced, which Ollama's API cannot ask.)"""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    result = "22 degrees celsius and sunny"
    openai_call = {
        "id": "call_1_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    expected = _openai(
        server,
        "chat/completions",
        {
            "model": DEFAULT_MODEL,
            "tools": [WEATHER],
            "temperature": 0,
            "max_tokens": 30,
            "messages": [
                *ask,
                {"role": "assistant", "content": None, "tool_calls": [openai_call]},
                {"role": "tool", "tool_call_id": "call_1_0", "name": "get_weather", "content": result},
            ],
        },
    )
    reply = client.chat(
        model=DEFAULT_MODEL,
        tools=[WEATHER],
        options={"temperature": 0, "num_predict": 30},
        messages=[
            *ask,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
            },
            {"role": "tool", "tool_name": "get_weather", "content": result},
        ],
    )
    message = expected["choices"][0]["message"]
    assert reply.message.content == (message["content"] or "")
    assert [(c.function.name, c.function.arguments) for c in reply.message.tool_calls or []] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []
    ]
    assert reply.prompt_eval_count == expected["usage"]["prompt_tokens"]


def test_embed_equals_the_openai_embeddings(client: ollama.Client, server: ServerProcess) -> None:
    texts = ["The cat sat on the mat.", "Paris is the capital of France."]
    expected = _openai(server, "embeddings", {"model": EMBEDDER, "input": texts})["data"]
    result = client.embed(model=EMBEDDER, input=texts)
    assert len(result.embeddings) == 2 and result.prompt_eval_count > 0
    for got, want in zip(result.embeddings, expected, strict=True):
        np.testing.assert_allclose(got, want["embedding"], atol=1e-6)
    short = client.embed(model=EMBEDDER, input=texts[0], dimensions=64).embeddings[0]
    assert len(short) == 64 and abs(np.linalg.norm(short) - 1) < 1e-5
    legacy = client.embeddings(model=EMBEDDER, prompt=texts[1]).embedding
    np.testing.assert_allclose(legacy, expected[1]["embedding"], atol=1e-6)
    assert client.embed(model=EMBEDDER, input=[]).embeddings == []
    with pytest.raises(ollama.ResponseError, match="exceeds the context length") as info:
        client.embed(model=EMBEDDER, input="word " * 400, truncate=False)
    assert info.value.status_code == 400
    assert len(client.embed(model=EMBEDDER, input="word " * 400).embeddings[0]) == 384  # truncated by default


@pytest.mark.parametrize(
    ("call", "status", "message"),
    [
        (lambda c: c.chat(model="nope", messages=QUESTION), 404, "model 'nope' not found"),
        (
            lambda c: c.chat(model=DEFAULT_MODEL, messages=[{**QUESTION[0], "images": [b"\x89PNG"]}]),
            400,
            "does not support images",
        ),
        (lambda c: c.chat(model=DEFAULT_MODEL, messages=QUESTION, think=True), 400, "does not support thinking"),
        (lambda c: c.chat(model=EMBEDDER, messages=QUESTION), 400, f'"{EMBEDDER}" does not support chat'),
        (lambda c: c.embed(model=DEFAULT_MODEL, input="hi"), 400, "does not support embeddings"),
        (
            lambda c: c.chat(model=DEFAULT_MODEL, messages=QUESTION, options={"temperature": "hot"}),
            400,
            "options.temperature",
        ),
        (lambda c: c.pull("llama3"), 404, "cannot be pulled"),
        (lambda c: c.delete(DEFAULT_MODEL), 403, "model repository"),
    ],
)
def test_errors_are_ollamas(client: ollama.Client, call, status: int, message: str) -> None:  # noqa: ANN001
    with pytest.raises(ollama.ResponseError) as info:
        call(client)
    assert info.value.status_code == status and message in info.value.error


def test_api_keys_are_needed(server: ServerProcess) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        ollama.Client(host=server.base_url).list()
    assert info.value.status_code == 401
    assert _client(server).pull(DEFAULT_MODEL).status == "success"  # a model that is there: nothing to pull


def _running(server: ServerProcess) -> set[str]:
    return {m.model for m in _client(server).ps().models}


def _wait_unloaded(server: ServerProcess, name: str) -> None:
    deadline = time.monotonic() + 30
    while name in _running(server):
        assert time.monotonic() < deadline, f"{name} was not unloaded"
        time.sleep(0.2)


def test_keep_alive_zero_unloads_for_the_admin_key_only(server: ServerProcess) -> None:
    user, admin = _client(server), _client(server, ADMIN_KEY)
    assert user.embed(model=EMBEDDER, input="hi", keep_alive=0).embeddings  # answered; stays: not the admin key
    assert EMBEDDER in _running(server)
    with pytest.raises(ollama.ResponseError, match="admin key") as info:
        user.generate(model=DEFAULT_MODEL, keep_alive=0)  # Ollama's unload request
    assert info.value.status_code == 403
    assert admin.embed(model=EMBEDDER, input="hi", keep_alive="0s").embeddings
    _wait_unloaded(server, EMBEDDER)  # unloaded once the answer was sent
    assert admin.generate(model=DEFAULT_MODEL, keep_alive=0).done_reason == "unload"
    assert DEFAULT_MODEL not in _running(server)
    with pytest.raises(ollama.ResponseError, match=f"model '{DEFAULT_MODEL}' not found"):
        user.chat(model=DEFAULT_MODEL, messages=QUESTION)
    loaded = admin.chat(model=DEFAULT_MODEL, messages=[], keep_alive="5m")  # Ollama's load request
    assert loaded.done_reason == "load" and DEFAULT_MODEL in _running(server)
    assert user.chat(model=DEFAULT_MODEL, messages=QUESTION, options={"temperature": 0, "num_predict": 3}).done
