"""A stored response survives a restart and is continued by the new process; keys guard the new routes (an
Anthropic client's `x-api-key` included) and a stored response belongs to the key that created it. One small
server (the LLM only) started twice on one store file."""

from __future__ import annotations

import shutil
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.conftest import DEFAULT_MODEL, ROOT, ServerProcess

KEY = "sk-responses-0123456789"
OTHER_KEY = "sk-responses-other-9876543210"


def _start(repo: Path, store: Path, keys: Path) -> ServerProcess:
    return ServerProcess(repo, "--responses-store", str(store), "--api-key-file", str(keys))


def test_stored_response_survives_restart(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "model_repository" / DEFAULT_MODEL, repo / DEFAULT_MODEL)
    store = tmp_path / "state" / "responses.sqlite3"
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY}\n{OTHER_KEY}\n")
    server = _start(repo, store, keys)
    try:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0, timeout=300)
        first = client.responses.create(
            model=DEFAULT_MODEL, temperature=0, max_output_tokens=30, input="What is the capital of France?"
        )
        assert "Paris" in first.output_text
        # the same key in Anthropic's header works; a wrong one is a 401 in Anthropic's shape
        claude = anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=300)
        assert claude.messages.create(model=DEFAULT_MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(anthropic.AuthenticationError) as err:
            anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0).messages.create(
                model=DEFAULT_MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
            )
        assert err.value.body["error"]["type"] == "authentication_error"
        for path in ("/v1/responses", "/v1/rerank", "/v1/score"):
            resp = httpx.post(f"{server.base_url}{path}", json={})
            assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
    finally:
        server.stop()
    server = _start(repo, store, keys)
    try:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0, timeout=300)
        assert client.responses.retrieve(first.id).output_text == first.output_text
        second = client.responses.create(
            model=DEFAULT_MODEL,
            temperature=0,
            max_output_tokens=30,
            input="And what is the capital of Germany?",
            previous_response_id=first.id,
        )
        assert "Berlin" in second.output_text and second.previous_response_id == first.id
        # a stored response belongs to the key that created it
        other = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=OTHER_KEY, max_retries=0, timeout=300)
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(first.id)
        with pytest.raises(openai.BadRequestError):
            other.responses.create(model=DEFAULT_MODEL, input="hi", previous_response_id=first.id)
        with pytest.raises(openai.NotFoundError):
            other.responses.delete(first.id)
        assert client.responses.retrieve(first.id).id == first.id
    finally:
        server.stop()
