"""Request fields beyond the basics: ranges (400 with `param`), logprob shapes, sessions, n>1 with logprobs."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import DEFAULT_MODEL

MSG = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def http(base_url: str):
    with httpx.Client(base_url=base_url, timeout=120) as c:
        yield c


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"top_logprobs": -1, "logprobs": True}, "top_logprobs"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"top_k": -2}, "top_k"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"seed": 2**64}, "seed"),
        ({"n": 10**6}, "n"),
        ({"logit_bias": {"1000000000": 1}}, "logit_bias"),
        ({"stop_token_ids": [10**9]}, "stop_token_ids"),
        ({"min_tokens": 50, "max_tokens": 10}, "min_tokens"),
        ({"user": 5}, "user"),
        ({"parallel_tool_calls": "maybe"}, "parallel_tool_calls"),
        ({"priority": "high"}, "priority"),
        ({"session_id": "x" * 300}, "session_id"),
        ({"chat_template_kwargs": "nope"}, "chat_template_kwargs"),
        ({"logprobs": "very"}, "logprobs"),
        ({"stream": "yes please"}, "stream"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "function": {"arguments": "{}"}}]}]},
            "messages.0.tool_calls.0.function.name",
        ),
    ],
)
def test_chat_ranges(http: httpx.Client, extra: dict, param: str) -> None:
    resp = http.post("/v1/chat/completions", json={"model": DEFAULT_MODEL, "messages": MSG, "max_tokens": 2, **extra})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logprobs": 6}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"best_of": 2, "n": 3}, "best_of"),
        ({"echo": "sometimes"}, "echo"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"prompt": [[1, 2], [10**9]]}, "prompt"),
    ],
)
def test_completion_ranges(http: httpx.Client, extra: dict, param: str) -> None:
    resp = http.post("/v1/completions", json={"model": DEFAULT_MODEL, "prompt": "hi", "max_tokens": 2, **extra})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_session_header_and_field_are_accepted(http: httpx.Client) -> None:
    body = {"model": DEFAULT_MODEL, "messages": MSG, "max_tokens": 2}
    assert http.post("/v1/chat/completions", json=body, headers={"X-Session-ID": "conv-1"}).status_code == 200
    assert http.post("/v1/chat/completions", json={**body, "session_id": "conv-1"}).status_code == 200
    assert (
        http.post(
            "/v1/completions",
            json={"model": DEFAULT_MODEL, "prompt": "hi", "max_tokens": 2},
            headers={"X-Session-ID": "conv-2"},
        ).status_code
        == 200
    )
    resp = http.post("/v1/chat/completions", json=body, headers={"X-Session-ID": "x" * 300})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "session_id"
    for session in ("conv-1", "conv-2"):  # leave no pinned KV behind for the tests that count sessions
        assert http.delete(f"/v1/sessions/{session}").status_code == 200


def test_chat_logprobs_shape(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=MSG, temperature=0, logprobs=True, top_logprobs=3
    )
    entries = resp.choices[0].logprobs.content
    assert len(entries) == resp.usage.completion_tokens  # the end-of-turn token that stopped it included
    assert "".join(e.token for e in entries[:-1]) == resp.choices[0].message.content
    for e in entries:
        assert e.bytes == list(e.token.encode("utf-8")) and e.logprob <= 0
        assert len(e.top_logprobs) == 3
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
        assert e.top_logprobs[0].token == e.token  # greedy picks the most likely token
    streamed = [
        e.token
        for chunk in client.chat.completions.create(
            model=DEFAULT_MODEL, messages=MSG, temperature=0, logprobs=True, top_logprobs=3, stream=True
        )
        if chunk.choices and chunk.choices[0].logprobs
        for e in chunk.choices[0].logprobs.content
    ]
    assert streamed == [e.token for e in entries]
    plain = client.chat.completions.create(model=DEFAULT_MODEL, messages=MSG, temperature=0, max_tokens=3)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_shape(client: openai.OpenAI) -> None:
    prompt = "The capital of France is"
    resp = client.completions.create(model=DEFAULT_MODEL, prompt=prompt, max_tokens=4, temperature=0, logprobs=2)
    lp = resp.choices[0].logprobs
    assert "".join(lp.tokens) == resp.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]
    for top, value in zip(lp.top_logprobs, lp.token_logprobs, strict=True):
        assert len(top) == 2 and max(top.values()) == value
    echoed = client.completions.create(
        model=DEFAULT_MODEL, prompt=prompt, max_tokens=4, temperature=0, logprobs=2, echo=True
    )
    assert echoed.choices[0].text == prompt + resp.choices[0].text
    assert echoed.choices[0].logprobs.text_offset[0] == len(prompt)


def test_n_streamed_with_logprobs(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=DEFAULT_MODEL, messages=MSG, n=3, seed=9, max_tokens=6, logprobs=True, stream=True
        )
    )
    texts, tokens, finishes = {}, {}, {}
    for chunk in chunks:
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            tokens.setdefault(ch.index, []).extend(e.token for e in (ch.logprobs.content if ch.logprobs else []))
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert sorted(finishes) == [0, 1, 2]
    for i in range(3):
        assert "".join(t for t in tokens[i] if t != "<|im_end|>") == texts[i]
