"""The admin API of named keys in-process (no model loaded: explicit model control): who may call it, keys
created, listed, changed, rotated and revoked, and what a key's policy does to the routes before any model runs
(401, 404 for models it may not use, hidden models, 429 with Retry-After, keys kept apart)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.config import build_config
from tests.conftest import DEFAULT_MODEL, ROOT

ADMIN = {"authorization": "Bearer sk-admin-test"}


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    config = build_config(
        model_repository=ROOT / "model_repository",
        model_control_mode="explicit",
        grpc_port=0,
        metrics_port=0,
        cache_dir=tmp_path,
        admin_keys=["sk-admin-test"],
    )
    with TestClient(create_app(config)) as c:
        yield c


def create(client: TestClient, **body: Any) -> dict[str, Any]:
    r = client.post("/admin/keys", json=body, headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_admin_api_needs_the_admin_key(client: TestClient, tmp_path: Path) -> None:
    assert client.get("/admin/keys").status_code == 401
    assert client.post("/admin/keys", json={"name": "x"}, headers=bearer("sk-wrong")).status_code == 401
    key = create(client, name="user")
    assert client.get("/admin/keys", headers=bearer(key["secret"])).status_code == 403  # a named key is no admin
    config = build_config(
        model_repository=ROOT / "model_repository",
        model_control_mode="explicit",
        grpc_port=0,
        metrics_port=0,
        cache_dir=tmp_path / "other",
    )
    with TestClient(create_app(config)) as no_admin:
        r = no_admin.get("/admin/keys", headers=ADMIN)
        assert r.status_code == 403 and "admin key" in r.json()["error"]["message"]


def test_keys_are_created_listed_changed_rotated_and_revoked(client: TestClient) -> None:
    assert client.get("/v1/models").status_code == 200  # no key anywhere: inference is open
    key = create(
        client,
        name="search",
        models=["smollm2-*"],
        rpm=100,
        tpm=5000,
        budget_tokens=10**6,
        budget_period="day",
        priority=3,
        metadata={"team": "search", "user": "ada"},
    )
    secret = key.pop("secret")
    assert secret.startswith("sk-sy-") and key["prefix"] == secret[:12] and key["status"] == "active"
    assert (key["rpm"], key["tpm"], key["priority"], key["metadata"]["team"]) == (100, 5000, 3, "search")
    assert client.get("/v1/models").status_code == 401  # once a named key exists, inference needs a key
    assert client.get("/v1/models", headers=bearer(secret)).status_code == 200

    listed = client.get("/admin/keys", headers=ADMIN).json()["data"]
    assert [k["id"] for k in listed] == [key["id"]] and "secret" not in listed[0]
    assert not any(secret in str(v) for v in listed[0].values())  # the secret is shown once only

    r = client.patch(f"/admin/keys/{key['id']}", json={"rpm": 5, "metadata": {"team": "ads"}}, headers=ADMIN)
    assert r.status_code == 200
    assert (r.json()["rpm"], r.json()["tpm"], r.json()["metadata"]) == (5, 5000, {"team": "ads"})
    r = client.patch(f"/admin/keys/{key['id']}", json={"tpm": -1}, headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tpm"
    assert client.patch("/admin/keys/key_nope", json={"rpm": 1}, headers=ADMIN).status_code == 404

    rotated = client.post(f"/admin/keys/{key['id']}/rotate", headers=ADMIN).json()
    assert rotated["id"] == key["id"] and rotated["secret"] != secret
    assert client.get("/v1/models", headers=bearer(secret)).status_code == 401
    assert client.get("/v1/models", headers=bearer(rotated["secret"])).status_code == 200

    other = create(client, name="other")
    revoked = client.delete(f"/admin/keys/{key['id']}", headers=ADMIN).json()
    assert revoked["status"] == "revoked" and revoked["revoked_at"]
    r = client.get("/v1/models", headers=bearer(rotated["secret"]))
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key" and "revoked" in r.text
    assert client.get("/v1/models", headers=bearer(other["secret"])).status_code == 200
    assert client.get(f"/admin/keys/{key['id']}", headers=ADMIN).json()["status"] == "revoked"


def test_bad_key_bodies_are_400_in_openai_shape(client: TestClient) -> None:
    for body in (
        {},
        {"name": ""},
        {"name": "x", "rpm": -1},
        {"name": "x", "budget_period": "week"},
        {"name": "x", "surprise": 1},
    ):
        r = client.post("/admin/keys", json=body, headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", body


def test_a_key_sees_only_its_models_elsewhere_404(client: TestClient) -> None:
    key = create(client, name="llm-only", models=[DEFAULT_MODEL])
    auth = bearer(key["secret"])
    names = {m["name"] for m in client.post("/v2/repository/index", headers=auth, json={}).json()}
    assert names == {DEFAULT_MODEL}  # the other folders are hidden from this key
    everything = {m["name"] for m in client.post("/v2/repository/index", headers=ADMIN, json={}).json()}
    assert "circle_classifier" in everything

    r = client.post(
        "/v1/chat/completions",
        headers=auth,
        json={"model": "circle_classifier", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert r.json()["error"]["message"] == "The model 'circle_classifier' does not exist or is not loaded."
    message = {"model": "circle_classifier", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    r = client.post(
        "/v1/messages", headers={"x-api-key": key["secret"], "anthropic-version": "2023-06-01"}, json=message
    )
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"  # Anthropic's shape
    assert client.get("/v2/models/circle_classifier", headers=auth).status_code == 404
    assert (
        client.post("/v1/embeddings", headers=auth, json={"model": "all-MiniLM-L6-v2", "input": "x"}).status_code == 404
    )


def test_limits_refuse_with_429_and_retry_after_and_never_touch_another_key(client: TestClient) -> None:
    tight, free = create(client, name="tight", rpm=2), create(client, name="free")
    for left in (1, 0):
        r = client.get("/v1/models", headers=bearer(tight["secret"]))
        assert r.status_code == 200 and r.headers["x-ratelimit-limit-requests"] == "2"  # as OpenAI's API says them
        assert r.headers["x-ratelimit-remaining-requests"] == str(left)
    r = client.get("/v1/models", headers=bearer(tight["secret"]))
    assert r.status_code == 429 and 0 < int(r.headers["retry-after"]) <= 60
    error = r.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
    assert "2 requests per minute" in error["message"]
    for _ in range(5):
        assert client.get("/v1/models", headers=bearer(free["secret"])).status_code == 200
    metrics = client.get("/metrics").text
    assert 'switchyard_key_refusals_total{reason="rate_limit"} 1.0' in metrics
    assert tight["id"] not in metrics  # no label per key unless --key-metrics-by-key


def test_usage_answers_json_and_csv_and_checks_its_times(client: TestClient) -> None:
    body = client.get("/admin/usage", headers=ADMIN).json()
    assert body["object"] == "list" and body["data"] == [] and body["group_by"] == "key_model"
    r = client.get("/admin/usage?format=csv&from=2026-01-01&to=1900000000", headers=ADMIN)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    assert r.text.splitlines()[0].startswith("key_id,key_name,model,start,requests,errors,prompt_tokens")
    r = client.get("/admin/usage?from=yesterday", headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["param"] == "from"
    assert client.get("/admin/usage?group_by=week", headers=ADMIN).status_code == 400
