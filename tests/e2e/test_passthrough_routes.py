"""The `openai` backend (an upstream used as it is) and routes, against real upstreams started here: the session's
Switchyard server (SmolLM2 and MiniLM) and a second Switchyard on SmolLM2 that wants an API key and is killed in
the last test, all driven by the openai and anthropic SDKs. llama.cpp's servers: test_passthrough_llamacpp.py."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.conftest import DEFAULT_MODEL, ServerProcess, smollm2_config
from tests.e2e.weather_tools import ASK, TIME, WEATHER

pytestmark = pytest.mark.slow

SECRET = "k-upstream-secret-7f3a"  # the second upstream's key: it must show nowhere
WRONG = "k-wrong-key-9c1e"
GREEDY = {"temperature": 0}  # the anthropic SDK takes sampling fields in the body
QUESTION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
]


def passthrough(base_url: str, model: str, extra: str = "") -> str:
    return f"backend: openai\nopenai:\n  base_url: {base_url}/v1\n  model: {model}\n  read_timeout_seconds: 60\n{extra}"


@pytest.fixture(scope="module")
def keyed_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A second Switchyard on SmolLM2 that wants a key (killed by the last test)."""
    repo = tmp_path_factory.mktemp("keyed_upstream")
    (repo / DEFAULT_MODEL).mkdir()
    (repo / DEFAULT_MODEL / "config.yaml").write_text(smollm2_config(4096))
    proc = ServerProcess(repo, "--api-key", SECRET, startup_timeout=300)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def gateway(
    server: ServerProcess, keyed_upstream: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("passthrough_repository")
    models = {
        "smol-up": passthrough(server.base_url, DEFAULT_MODEL),
        "minilm-up": passthrough(server.base_url, "all-minilm-l6-v2"),
        "doomed": passthrough(keyed_upstream.base_url, DEFAULT_MODEL, "  api_key_file: key.txt\n"),
        "wrong-key": passthrough(keyed_upstream.base_url, DEFAULT_MODEL, "  api_key_env: WRONG_UPSTREAM_KEY\n"),
        "narrow": passthrough(server.base_url, DEFAULT_MODEL, "scheduler:\n  max_num_seqs: 1\n  max_queue_size: 1\n"),
    }
    for name, config in models.items():
        (repo / name).mkdir()
        (repo / name / "config.yaml").write_text(config)
    (repo / "doomed" / "key.txt").write_text(SECRET + "\n")
    routes = repo.parent / "routes.yaml"
    routes.write_text(
        "routes:\n  gpt-4o-mini: smol-up\n  resilient:\n    targets: [doomed, smol-up]\n    timeout_seconds: 60\n"
    )
    os.environ["WRONG_UPSTREAM_KEY"] = WRONG
    try:
        proc = ServerProcess(repo, "--routes", str(routes), startup_timeout=120)
    finally:
        del os.environ["WRONG_UPSTREAM_KEY"]
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def client(gateway: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def direct(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_greedy_chat_equals_the_upstreams_own(client: openai.OpenAI, direct: openai.OpenAI) -> None:
    ours = client.chat.completions.create(model="smol-up", messages=QUESTION, temperature=0, max_tokens=12)
    theirs = direct.chat.completions.create(model=DEFAULT_MODEL, messages=QUESTION, temperature=0, max_tokens=12)
    assert ours.model == "smol-up"
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens > 0
    assert ours.usage.completion_tokens == theirs.usage.completion_tokens


def test_streams_pass_through_with_usage_only_when_asked(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="smol-up",
            messages=QUESTION,
            temperature=0,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(c.model == "smol-up" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices == [] and 0 < chunks[-1].usage.completion_tokens <= 8
    bare = list(client.chat.completions.create(model="smol-up", messages=QUESTION, max_tokens=4, stream=True))
    assert all(c.choices and c.usage is None for c in bare)


def test_completions_pass_through(client: openai.OpenAI) -> None:
    resp = client.completions.create(model="smol-up", prompt="The capital of France is", max_tokens=4, temperature=0)
    assert resp.model == "smol-up" and resp.choices[0].text and 0 < resp.usage.completion_tokens <= 4
    text = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="smol-up", prompt="The capital of France is", max_tokens=4, temperature=0, stream=True
        )
        if c.choices
    )
    assert text == resp.choices[0].text


def test_tools_and_response_format_pass_through(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model="smol-up",
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=60,
    )
    call = resp.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and resp.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    schema = {
        "type": "object",
        "properties": {"capital": {"enum": ["Paris", "Rome", "Berlin"]}},
        "required": ["capital"],
    }
    answer = client.chat.completions.create(
        model="smol-up",
        messages=QUESTION,
        temperature=0,
        max_tokens=30,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    )
    jsonschema.validate(json.loads(answer.choices[0].message.content), schema)


def test_embeddings_pass_through(client: openai.OpenAI, direct: openai.OpenAI) -> None:
    ours = client.embeddings.create(model="minilm-up", input=["hello", "world"])
    theirs = direct.embeddings.create(model="all-minilm-l6-v2", input=["hello", "world"])
    assert ours.model == "minilm-up" and len(ours.data) == 2
    assert ours.data[1].embedding == theirs.data[1].embedding and len(ours.data[0].embedding) == 384


def test_responses_and_messages_work_over_the_upstream(client: openai.OpenAI, gateway: ServerProcess) -> None:
    chat = client.chat.completions.create(model="smol-up", messages=QUESTION, temperature=0, max_tokens=10)
    resp = client.responses.create(
        model="smol-up",
        instructions="Answer briefly.",
        temperature=0,
        max_output_tokens=10,
        input="What is the capital of France?",
    )
    assert resp.output_text == chat.choices[0].message.content
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    events = [e.type for e in client.responses.create(model="smol-up", input="Hi", max_output_tokens=4, stream=True)]
    assert events[0] == "response.created" and events[-1] in ("response.completed", "response.incomplete")
    claude = anthropic.Anthropic(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=120)
    message = claude.messages.create(
        model="smol-up",
        max_tokens=10,
        extra_body=GREEDY,
        system="Answer briefly.",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    assert message.content[0].text == chat.choices[0].message.content
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    with claude.messages.stream(
        model="smol-up",
        max_tokens=10,
        extra_body=GREEDY,
        system="Answer briefly.",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == message.content[0].text
    assert final.usage.output_tokens == message.usage.output_tokens


def test_upstream_refusals_keep_their_status_and_message(gateway: ServerProcess) -> None:
    refused = httpx.post(
        f"{gateway.base_url}/v1/completions",
        timeout=60,
        json={"model": "smol-up", "prompt": "Hi", "suffix": "end", "max_tokens": 2},
    )
    assert refused.status_code == 400 and "suffix" in refused.json()["error"]["message"]
    tokenize = httpx.post(f"{gateway.base_url}/tokenize", json={"model": "smol-up", "prompt": "Hi"}, timeout=60)
    assert tokenize.status_code == 400 and "no tokenizer here" in tokenize.json()["error"]["message"]


def test_a_wrong_upstream_key_is_a_bad_gateway_and_keys_show_nowhere(gateway: ServerProcess) -> None:
    bad = httpx.post(
        f"{gateway.base_url}/v1/chat/completions",
        timeout=60,
        json={"model": "wrong-key", "messages": QUESTION, "max_tokens": 2},
    )
    assert bad.status_code == 502 and "credentials" in bad.json()["error"]["message"]
    models = httpx.get(f"{gateway.base_url}/v1/models").text
    assert {"smol-up", "minilm-up", "gpt-4o-mini", "resilient"} <= {m["id"] for m in json.loads(models)["data"]}
    for text in (bad.text, models, gateway.log()):
        assert SECRET not in text and WRONG not in text


def test_an_alias_serves_its_model_and_says_so_in_headers(client: openai.OpenAI, gateway: ServerProcess) -> None:
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=QUESTION, max_tokens=2)
    assert raw.headers["x-switchyard-route"] == "gpt-4o-mini" and raw.headers["x-switchyard-model"] == "smol-up"
    assert raw.headers["x-switchyard-attempts"] == "1" and raw.parse().model == "smol-up"
    metrics = httpx.get(f"{gateway.base_url}/metrics").text
    assert 'switchyard_route_requests_total{model="smol-up",route="gpt-4o-mini"}' in metrics
    assert (
        float(
            next(
                line.split()[-1]
                for line in metrics.splitlines()
                if line.startswith('switchyard_generation_tokens_total{model="smol-up"}')
            )
        )
        > 0
    )


def test_a_busy_upstreams_queue_times_out_and_sheds_in_openais_shape(
    client: openai.OpenAI, gateway: ServerProcess
) -> None:
    """`narrow` lets one request in at a time and one wait: a request still waiting at its timeout, and one that
    finds the queue full, get 429 with Retry-After; the one waiting within its timeout is served."""
    holder = client.chat.completions.create(  # holds the only slot until it is closed
        model="narrow",
        messages=[{"role": "user", "content": "Count to a thousand."}],
        max_tokens=2000,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError) as timed_out:
        client.chat.completions.create(model="narrow", messages=QUESTION, max_tokens=2, extra_body={"timeout": 0.3})
    assert time.monotonic() - started >= 0.3
    served: list[str | None] = []
    waiter = threading.Thread(
        target=lambda: served.append(
            client.chat.completions.create(model="narrow", messages=QUESTION, max_tokens=2).choices[0].message.content
        )
    )
    waiter.start()
    deadline = time.monotonic() + 10
    while 'switchyard_num_requests_waiting{model="narrow"} 1.0' not in httpx.get(f"{gateway.base_url}/metrics").text:
        assert time.monotonic() < deadline, "the second request never queued"
        time.sleep(0.02)
    with pytest.raises(openai.RateLimitError) as shed:
        client.chat.completions.create(model="narrow", messages=QUESTION, max_tokens=2)
    holder.close()  # the client goes away: its slot goes to the waiting request
    waiter.join(timeout=60)
    assert served and served[0]
    for err, words in ((timed_out.value, "timeout"), (shed.value, "queue is full")):
        assert err.status_code == 429 and err.code == "model_overloaded" and err.type == "rate_limit_error"
        assert words in err.message and err.response.headers["Retry-After"].isdigit()
    metrics = httpx.get(f"{gateway.base_url}/metrics").text
    for reason in ("queue_timeout", "queue_full"):
        assert f'switchyard_requests_rejected_total{{model="narrow",reason="{reason}"}} 1.0' in metrics


def test_killing_the_first_upstream_mid_run_fails_no_request_that_had_not_started_streaming(
    gateway: ServerProcess, keyed_upstream: ServerProcess
) -> None:
    """Four clients (two streaming) on `resilient` (doomed, then smol-up); doomed's server is killed mid-run."""
    results: list[tuple[str, str | None, bool]] = []  # (outcome, model that served, stream had started)
    stop = threading.Event()

    def client_loop(stream: bool) -> None:
        body = {"model": "resilient", "messages": QUESTION, "max_tokens": 6, "stream": stream}
        with httpx.Client(base_url=gateway.base_url, timeout=60) as http:
            while not stop.is_set():
                started = False
                try:
                    with http.stream("POST", "/v1/chat/completions", json=body) as resp:
                        served = resp.headers.get("x-switchyard-model")
                        if resp.status_code != 200:
                            resp.read()
                            results.append((f"HTTP {resp.status_code}: {resp.text[:200]}", served, False))
                            continue
                        text = ""
                        for line in resp.iter_lines():
                            started = True
                            text += line
                        failed = '"error"' in text or "[DONE]" not in text if stream else not text
                        results.append(("failed" if failed else "ok", served, started))
                except httpx.HTTPError as exc:
                    results.append((f"{exc.__class__.__name__}", None, started))

    threads = [threading.Thread(target=client_loop, args=(i % 2 == 1,)) for i in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while sum(1 for _, m, _ in results if m == "doomed") < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    keyed_upstream.proc.kill()  # no goodbye: connections drop mid-answer
    killed_at = len(results)
    deadline = time.monotonic() + 30
    while sum(1 for _, m, _ in results[killed_at:] if m == "smol-up") < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    served_by = {m for _, m, _ in results}
    assert {"doomed", "smol-up"} <= served_by, results
    failures = [r for r in results if r[0] != "ok"]
    assert all(started for _, _, started in failures), f"requests failed before streaming: {failures}"
    assert sum(1 for outcome, m, _ in results[killed_at:] if outcome == "ok" and m == "smol-up") >= 8
    metrics = httpx.get(f"{gateway.base_url}/metrics").text
    assert 'switchyard_route_fallbacks_total{model="doomed",reason="connect",route="resilient"}' in metrics
