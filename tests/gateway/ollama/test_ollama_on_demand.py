"""Ollama's routes over models that load on request, against a real server (--model-control-mode on_demand) with
SmolLM2 and MiniLM, through the `ollama` client: /api/tags lists both before anything is loaded (an editor's model
picker sees them), /api/show describes them from their files without loading them, /api/ps shows none until a chat
loads SmolLM2, then it with an expiry in the future; a chat's keep_alive 0 unloads it once the answer is sent."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import ollama
import pytest

from tests.conftest import ROOT, ServerProcess, smollm2_config

MODEL = "smol"
EMBEDDER = "all-minilm-l6-v2"
KEEP_ALIVE = timedelta(minutes=10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("ollama_on_demand")
    (repo / MODEL).mkdir()
    (repo / MODEL / "config.yaml").write_text(smollm2_config(2048))
    shutil.copytree(ROOT / "model_repository" / EMBEDDER, repo / EMBEDDER)
    proc = ServerProcess(repo, "--model-control-mode", "on_demand", "--keep-alive", "10m")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> ollama.Client:
    return ollama.Client(host=server.base_url, timeout=120)


def state(server: ServerProcess, name: str = MODEL) -> str:
    cards = httpx.get(f"{server.base_url}/v1/models").json()["data"]
    return next(card["state"] for card in cards if card["id"] == name)


def test_the_list_has_the_models_not_loaded_and_ps_has_none(server: ServerProcess, client: ollama.Client) -> None:
    listed = {m.model: m for m in client.list().models}
    assert sorted(listed) == [EMBEDDER, MODEL]
    smol, minilm = listed[MODEL], listed[EMBEDDER]
    assert smol.details is not None and minilm.details is not None
    assert (smol.details.format, smol.details.family, smol.details.quantization_level) == ("gguf", "llama", "Q4_1")
    assert smol.details.parameter_size == "134.52M" and smol.size is not None and smol.size > 50e6
    assert (minilm.details.format, minilm.details.family) == ("safetensors", "bert") and minilm.size > 80e6
    assert smol.digest and len(smol.digest) == 64 and smol.modified_at is not None
    assert client.ps().models == []
    assert state(server) == state(server, EMBEDDER) == "not-loaded"


def test_show_describes_a_model_without_loading_it(server: ServerProcess, client: ollama.Client) -> None:
    shown = client.show(f"{MODEL}:latest")
    assert shown.capabilities == ["completion", "tools"] and "<|im_start|>" in (shown.template or "")
    assert shown.modelinfo is not None and shown.modelinfo["llama.context_length"] == 8192  # the weights' own
    assert shown.parameters == f"{'num_ctx':<30} 2048"  # served with its config's max_model_len
    assert client.show(EMBEDDER).capabilities == ["embedding"]
    assert state(server) == state(server, EMBEDDER) == "not-loaded" and client.ps().models == []


def test_a_chat_loads_the_model_and_ps_shows_when_it_expires(server: ServerProcess, client: ollama.Client) -> None:
    answer = client.chat(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2, "temperature": 0}
    )
    assert answer.done and answer.message.role == "assistant"
    now = datetime.now(UTC)
    running = client.ps().models
    assert [(m.model, m.size_vram, m.context_length) for m in running] == [(MODEL, 0, 2048)]
    expires = running[0].expires_at
    assert expires is not None and now < expires <= now + KEEP_ALIVE  # idle since the answer: under 10 minutes left
    listed = {m.model: m for m in client.list().models}
    assert sorted(listed) == [EMBEDDER, MODEL]  # listed, loaded or not
    assert running[0].size is not None and running[0].size > (listed[MODEL].size or 0)  # the weights and KV pool
    assert state(server, EMBEDDER) == "not-loaded"


def test_keep_alive_0_unloads_the_model_after_the_answer(server: ServerProcess, client: ollama.Client) -> None:
    chat = client.chat(
        model=f"{MODEL}:latest",
        messages=[{"role": "user", "content": "Hi"}],
        keep_alive=0,
        options={"num_predict": 2, "temperature": 0},
    )
    assert chat.done
    deadline = time.monotonic() + 10
    while state(server) != "not-loaded":  # unloaded once the answer is sent, with no admin key
        assert time.monotonic() < deadline, "keep_alive 0 did not unload the model"
        time.sleep(0.1)
    assert client.ps().models == []
    metrics = httpx.get(f"{server.base_url}/metrics").text
    assert f'switchyard_model_evictions_total{{model="{MODEL}",reason="idle"}} 1.0' in metrics


def test_unknown_models_are_still_ollamas_404(server: ServerProcess, client: ollama.Client) -> None:
    r = httpx.post(
        f"{server.base_url}/api/chat", json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert r.status_code == 404 and r.json() == {"error": "model 'nope' not found"}
    with pytest.raises(ollama.ResponseError) as raised:
        client.show("nope")
    assert raised.value.status_code == 404
