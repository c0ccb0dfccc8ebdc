"""Named keys against a real server with SmolLM2: created through the admin API, used by the openai and anthropic
SDKs on /v1 chat and completions, Responses and Messages; usage equals what the clients were told; limits and
budgets answer 429 with Retry-After; models a key may not use do not exist for it; a revoked key gets 401."""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import DEFAULT_MODEL, ServerProcess, smollm2_config

ADMIN_KEY = "sk-admin-keys-0123456789"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("keys_repository")
    (repo / DEFAULT_MODEL).mkdir()
    (repo / DEFAULT_MODEL / "config.yaml").write_text(smollm2_config(4096))  # a small KV pool: a quick start
    state = tmp_path_factory.mktemp("keys_state")
    (state / "admin").write_text(ADMIN_KEY + "\n")
    # a key store of its own: keys in the shared default one would close inference on other tests' servers
    proc = ServerProcess(
        repo,
        "--admin-key-file",
        str(state / "admin"),
        "--key-store",
        str(state / "keys.sqlite3"),
        "--key-usage-flush-secs",
        "0.5",
    )
    try:
        yield proc
    finally:
        proc.stop()


def create_key(server: ServerProcess, **body: Any) -> dict[str, Any]:
    r = httpx.post(f"{server.base_url}/admin/keys", json=body, headers=ADMIN, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def openai_client(server: ServerProcess, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=secret, max_retries=0)


def usage_of(server: ServerProcess, key: str, fmt: str = "json") -> httpx.Response:
    r = httpx.get(f"{server.base_url}/admin/usage", params={"key": key, "format": fmt}, headers=ADMIN, timeout=30)
    assert r.status_code == 200, r.text
    return r


def openai_counts(usage: Any) -> Counter[str]:
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    return Counter(prompt=usage.prompt_tokens, completion=usage.completion_tokens, cached=cached)


def test_usage_per_key_equals_what_the_clients_were_told(server: ServerProcess) -> None:
    key = create_key(server, name="team-a", models=[DEFAULT_MODEL], metadata={"team": "a", "user": "ada"})
    client = openai_client(server, key["secret"])
    told: Counter[str] = Counter()
    for _ in range(2):  # the second one finds the chat template's system prompt in the prefix cache
        told += openai_counts(
            client.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES, max_tokens=6).usage
        )
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=MESSAGES, max_tokens=6, stream=True, stream_options={"include_usage": True}
    )
    told += openai_counts([chunk.usage for chunk in stream if chunk.usage][-1])
    told += openai_counts(client.completions.create(model=DEFAULT_MODEL, prompt="Once upon a time", max_tokens=5).usage)
    usage = client.responses.create(model=DEFAULT_MODEL, input="Hi", max_output_tokens=5, store=False).usage
    told += Counter(
        prompt=usage.input_tokens, completion=usage.output_tokens, cached=usage.input_tokens_details.cached_tokens or 0
    )
    message = anthropic.Anthropic(base_url=server.base_url, api_key=key["secret"], max_retries=0).messages.create(
        model=DEFAULT_MODEL, max_tokens=5, messages=[{"role": "user", "content": "Hi"}]
    )
    read = message.usage.cache_read_input_tokens or 0  # Anthropic's input_tokens leave out the cached ones
    told += Counter(prompt=message.usage.input_tokens + read, completion=message.usage.output_tokens, cached=read)
    with pytest.raises(openai.BadRequestError):  # a request that fails once it named its model counts as an error
        client.chat.completions.create(
            model=DEFAULT_MODEL, max_tokens=6, messages=[{"role": "user", "content": "hi " * 9000}]
        )

    [row] = usage_of(server, "team-a").json()["data"]
    assert (row["key_id"], row["key_name"], row["model"], row["metadata"]["team"]) == (
        key["id"],
        "team-a",
        DEFAULT_MODEL,
        "a",
    )
    assert (row["requests"], row["errors"]) == (7, 1)
    assert (row["prompt_tokens"], row["completion_tokens"], row["cached_tokens"]) == (
        told["prompt"],
        told["completion"],
        told["cached"],
    )
    [csv_row] = list(csv.DictReader(io.StringIO(usage_of(server, key["id"], "csv").text)))
    assert int(csv_row["total_tokens"]) == told["prompt"] + told["completion"] and csv_row["key_name"] == "team-a"


def test_limits_and_budgets_answer_429_with_retry_after_for_their_key_only(server: ServerProcess) -> None:
    tight = openai_client(server, create_key(server, name="tight", tpm=20)["secret"])
    spent = openai_client(server, create_key(server, name="spent", budget_tokens=10, budget_period="day")["secret"])
    other = openai_client(server, create_key(server, name="other", rpm=100)["secret"])
    for client in (tight, spent):
        client.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES, max_tokens=8)  # takes it past
    with pytest.raises(openai.RateLimitError) as limited:
        tight.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES, max_tokens=8)
    assert limited.value.code == "rate_limit_exceeded" and "20 tokens per minute" in limited.value.message
    assert 0 < int(limited.value.response.headers["retry-after"]) <= 60
    with pytest.raises(openai.RateLimitError) as quota:
        spent.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES, max_tokens=8)
    assert quota.value.code == "insufficient_quota" and int(quota.value.response.headers["retry-after"]) > 0
    for _ in range(3):  # the other keys' refusals never touch this one
        other.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES, max_tokens=2)


def test_a_key_without_a_model_sees_no_such_model_and_a_revoked_key_gets_401(server: ServerProcess) -> None:
    key = create_key(server, name="aliases-only", models=["gpt-4o-*"])
    client = openai_client(server, key["secret"])
    assert [m.id for m in client.models.list()] == []
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES, max_tokens=2)
    assert missing.value.code == "model_not_found"
    allowed = openai_client(server, create_key(server, name="smol", models=[DEFAULT_MODEL])["secret"])
    assert [m.id for m in allowed.models.list()] == [DEFAULT_MODEL]
    r = httpx.delete(f"{server.base_url}/admin/keys/{key['id']}", headers=ADMIN, timeout=30)
    assert r.json()["status"] == "revoked"
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    assert httpx.get(f"{server.base_url}/v1/models", timeout=30).status_code == 401  # keys exist: no anonymous calls
