"""/tokenize and /detokenize in vLLM's shapes, agreeing with what generation counts."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import DEFAULT_MODEL

MSGS = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def http(base_url: str):
    with httpx.Client(base_url=base_url, timeout=120) as c:
        yield c


def test_tokenize_prompt_and_back(http: httpx.Client) -> None:
    request = {"model": DEFAULT_MODEL, "prompt": "Hello world", "return_token_strs": True}
    body = http.post("/tokenize", json=request).json()
    assert set(body) == {"count", "max_model_len", "tokens", "token_strs"}
    assert body["count"] == len(body["tokens"]) == 2 and body["max_model_len"] == 8192
    assert body["token_strs"] == ["Hello", "Ġworld"]
    back = http.post("/detokenize", json={"model": DEFAULT_MODEL, "tokens": body["tokens"]}).json()
    assert back == {"prompt": "Hello world"}
    # model may be left out when one model is served, as with vLLM
    assert http.post("/tokenize", json={"prompt": "Hello world"}).json()["tokens"] == body["tokens"]


def test_tokenize_messages_counts_what_chat_counts(http: httpx.Client) -> None:
    body = http.post("/tokenize", json={"model": DEFAULT_MODEL, "messages": MSGS}).json()
    chat = http.post("/v1/chat/completions", json={"model": DEFAULT_MODEL, "messages": MSGS, "max_tokens": 1}).json()
    assert body["count"] == chat["usage"]["prompt_tokens"] and body["token_strs"] is None
    text = http.post("/detokenize", json={"tokens": body["tokens"]}).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\n") and "What is the capital of France?" in text
    no_prompt = http.post("/tokenize", json={"messages": MSGS, "add_generation_prompt": False}).json()
    assert no_prompt["count"] < body["count"]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": DEFAULT_MODEL, "prompt": "a", "messages": MSGS}, 400, None),
        ("/tokenize", {"model": DEFAULT_MODEL}, 400, None),
        ("/tokenize", {"model": "nope", "prompt": "a"}, 404, "model"),
        ("/detokenize", {"model": DEFAULT_MODEL, "tokens": [1, -1]}, 400, "tokens"),
        ("/detokenize", {"model": DEFAULT_MODEL, "tokens": [10**9]}, 400, "tokens"),
        ("/detokenize", {"model": DEFAULT_MODEL, "tokens": "abc"}, 400, "tokens"),
    ],
)
def test_tokenize_errors(http: httpx.Client, path: str, body: dict, status: int, param: str | None) -> None:
    resp = http.post(path, json=body)
    assert resp.status_code == status, resp.text
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
    if param is not None:
        assert resp.json()["error"]["param"] == param
