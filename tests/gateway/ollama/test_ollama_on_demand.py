"""Ollama's routes over models that load on request, against a real server (--model-control-mode on_demand) with
SmolLM2: a request for a model that is not loaded (/api/show of `name:latest`) loads it, as Ollama does, and a chat's
keep_alive 0 unloads it once the answer is sent."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import ServerProcess, smollm2_config

MODEL = "smol"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("ollama_on_demand")
    (repo / MODEL).mkdir()
    (repo / MODEL / "config.yaml").write_text(smollm2_config(2048))
    proc = ServerProcess(repo, "--model-control-mode", "on_demand", "--keep-alive", "10m")
    try:
        yield proc
    finally:
        proc.stop()


def state(server: ServerProcess) -> str:
    cards = httpx.get(f"{server.base_url}/v1/models").json()["data"]
    return next(card["state"] for card in cards if card["id"] == MODEL)


def test_a_request_loads_the_model_and_keep_alive_0_unloads_it_after(server: ServerProcess) -> None:
    assert state(server) == "not-loaded"
    assert httpx.get(f"{server.base_url}/api/ps").json() == {"models": []}
    show = httpx.post(f"{server.base_url}/api/show", timeout=120, json={"model": f"{MODEL}:latest"})
    assert show.status_code == 200, show.text  # loaded for the request, as Ollama does
    assert "completion" in show.json()["capabilities"] and state(server) == "loaded"
    assert [m["name"] for m in httpx.get(f"{server.base_url}/api/ps").json()["models"]] == [MODEL]

    chat = httpx.post(
        f"{server.base_url}/api/chat",
        timeout=60,
        json={
            "model": f"{MODEL}:latest",
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": False,
            "keep_alive": 0,
            "options": {"num_predict": 2, "temperature": 0},
        },
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["done"] is True and chat.json()["message"]["role"] == "assistant"
    deadline = time.monotonic() + 10
    while state(server) != "not-loaded":  # unloaded once the answer is sent, with no admin key
        assert time.monotonic() < deadline, "keep_alive 0 did not unload the model"
        time.sleep(0.1)
    metrics = httpx.get(f"{server.base_url}/metrics").text
    assert f'switchyard_model_evictions_total{{model="{MODEL}",reason="idle"}} 1.0' in metrics


def test_unknown_models_are_still_ollamas_404(server: ServerProcess) -> None:
    r = httpx.post(
        f"{server.base_url}/api/chat", json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert r.status_code == 404 and r.json() == {"error": "model 'nope' not found"}
