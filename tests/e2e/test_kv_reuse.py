"""Prefix caching and KV sessions seen from outside: metrics show reused prompt tokens; answers do not change."""

from __future__ import annotations

import httpx

from tests.conftest import DEFAULT_MODEL, ServerProcess

HISTORY = " ".join(f"Fact {i}: {i} squared is {i * i}." for i in range(30))


def _complete(server: ServerProcess, prompt: str, headers: dict[str, str] | None = None) -> tuple[str, int]:
    text, usage = _complete_with_usage(server, prompt, headers)
    return text, usage["prompt_tokens"]


def _complete_with_usage(server: ServerProcess, prompt: str, headers: dict[str, str] | None = None) -> tuple[str, dict]:
    body = {"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    resp = httpx.post(server.base_url + "/v1/completions", json=body, headers=headers or {}, timeout=120)
    resp.raise_for_status()
    return resp.json()["choices"][0]["text"], resp.json()["usage"]


def test_repeated_prefix_is_served_from_cache_with_identical_output(server: ServerProcess) -> None:
    prompt = f"{HISTORY}\nQuestion: what is 7 squared?\nAnswer:"
    first, prompt_tokens = _complete(server, prompt)
    hits_before = server.metric("switchyard_prefix_cache_hits_total")
    second, usage = _complete_with_usage(server, prompt)
    hits = server.metric("switchyard_prefix_cache_hits_total") - hits_before
    assert second == first
    assert prompt_tokens > 200
    assert hits == (prompt_tokens - 1) // 16 * 16  # every full block but the one holding the last token
    assert usage["prompt_tokens_details"] == {"cached_tokens": hits}  # as OpenAI reports cached prompt tokens


def test_session_pins_conversation_and_delete_ends_it(server: ServerProcess) -> None:
    sessions_before = server.metric("switchyard_kv_sessions")  # other tests' stored conversations keep theirs
    turn1 = f"Session test. {HISTORY}\nQuestion: what is 9 squared?\nAnswer:"
    answer, turn1_tokens = _complete(server, turn1, {"X-Session-ID": "conv-1"})
    assert server.metric("switchyard_kv_sessions") >= 1
    assert server.metric("switchyard_kv_session_pinned_blocks") >= turn1_tokens // 16
    hits_before = server.metric("switchyard_prefix_cache_hits_total")
    _complete(server, turn1 + answer + "\nQuestion: and 3 squared?\nAnswer:", {"X-Session-ID": "conv-1"})
    assert server.metric("switchyard_prefix_cache_hits_total") - hits_before >= turn1_tokens // 16 * 16
    assert httpx.delete(server.base_url + "/v1/sessions/conv-1").json()["deleted"] is True
    resp = httpx.delete(server.base_url + "/v1/sessions/conv-1")
    assert resp.status_code == 404 and resp.json()["error"]["type"] == "not_found_error"
    assert server.metric("switchyard_kv_sessions") == sessions_before


def test_session_id_in_body_is_accepted(server: ServerProcess) -> None:
    body = {
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "session_id": "conv-body",
    }
    assert httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60).status_code == 200
    assert httpx.delete(server.base_url + "/v1/sessions/conv-body").status_code == 200
