"""Ollama's routes in-process with no model loaded: the server routes, errors in Ollama's shape (unknown models,
bad bodies, keys), the model-management answers, and `HEAD /` beside the web console."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.config import build_config
from tests.conftest import ROOT

KEY = "sk-ollama-test"


def client(**settings: Any) -> TestClient:
    """The app without its lifespan: the routes answer, no model is loaded."""
    return TestClient(create_app(build_config(model_repository=ROOT / "model_repository", **settings)))


def test_version_tags_and_ps_with_nothing_loaded() -> None:
    c = client()
    assert c.get("/api/version").json() == {"version": "0.33.0"}
    assert c.get("/api/tags").json() == {"models": []}
    assert c.get("/api/ps").json() == {"models": []}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/api/chat", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
        ("post", "/api/chat", {"model": "nope:latest", "messages": []}),
        ("post", "/api/generate", {"model": "nope", "prompt": "hi", "stream": False}),
        ("post", "/api/generate", {"model": "nope", "keep_alive": 0}),
        ("post", "/api/embed", {"model": "nope", "input": "hi"}),
        ("post", "/api/embeddings", {"model": "nope", "prompt": "hi"}),
        ("post", "/api/show", {"model": "nope"}),
        ("post", "/api/show", {"name": "nope"}),
        ("delete", "/api/delete", {"model": "nope"}),
    ],
)
def test_unknown_models_are_ollamas_404(method: str, path: str, body: dict) -> None:
    r = client().request(method.upper(), path, json=body)
    assert r.status_code == 404 and r.json() == {"error": f"model '{body.get('model') or body['name']}' not found"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"model": ', "not valid JSON"),
        (b'{"messages": []}', "model"),
        (b'{"model": "m", "messages": [{"role": "robot", "content": "hi"}]}', "messages.0.role"),
        (b'{"model": "m", "messages": [], "keep_alive": "soon"}', 'invalid duration "soon"'),
        (b'{"model": "m", "messages": [], "think": "very"}', "think"),
    ],
)
def test_bad_bodies_are_ollamas_400(body: bytes, message: str) -> None:
    r = client().post("/api/chat", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and set(r.json()) == {"error"} and message in r.json()["error"]


def test_the_model_management_routes_say_where_models_come_from() -> None:
    c = client()
    for path in ("/api/push", "/api/create"):
        r = c.post(path, json={"model": "x"})
        assert r.status_code == 403 and "model repository" in r.json()["error"]
    r = c.post("/api/pull", json={"model": "llama3"})
    assert r.status_code == 404 and "cannot be pulled" in r.json()["error"] and "model repository" in r.json()["error"]
    assert c.post("/api/show", json={}).json() == {"error": "model is required"}
    assert c.post("/api/copy", json={"source": "a", "destination": "b"}).status_code == 404


def test_api_keys_guard_the_routes_with_ollama_errors() -> None:
    c = client(api_keys=[KEY])
    r = c.get("/api/tags")
    assert r.status_code == 401 and set(r.json()) == {"error"}
    assert c.get("/api/tags", headers={"authorization": f"Bearer {KEY}"}).json() == {"models": []}


def test_head_root_answers_beside_the_console() -> None:
    with_console = client()
    assert with_console.head("/").status_code == 200  # Ollama's CLI checks the server with HEAD /
    assert with_console.get("/").headers["content-type"].startswith("text/html")  # the console's page stays
    bare = client(console=False)  # no console: nothing at / (docs/console.md)
    assert bare.get("/").status_code == 404 and bare.head("/").status_code in (404, 405)
