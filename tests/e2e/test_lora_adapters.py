"""LoRA adapters on a real server (SmolLM2, native engine): one listed in the model's config, one loaded and unloaded
at run time with vLLM's admin calls while requests run; names, /v1/models cards, the prefix cache keyed by adapter,
and the admin calls' refusals. Adapters are random PEFT folders (bench/lora_files.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.lora_files import write_peft_adapter
from tests.conftest import ADMIN_HEADERS, ADMIN_KEY, ServerProcess, smollm2_config

MODEL = "smol"
PROMPT = "Write one sentence about the sea. " * 3  # several full KV blocks


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("lora")
    repo, lora_dir = root / "repo", root / "adapters"
    write_peft_adapter(repo / MODEL / "adapters" / "sql", seed=1)
    write_peft_adapter(lora_dir / "chat", seed=2, targets=("q_proj", "v_proj", "down_proj"))
    (repo / MODEL / "config.yaml").write_text(smollm2_config(4096, "lora_adapters:\n  sql: adapters/sql\n"))
    (root / "admin-key").write_text(ADMIN_KEY + "\n")
    proc = ServerProcess(repo, "--lora-dir", str(lora_dir), "--admin-key-file", str(root / "admin-key"))
    try:
        yield proc, lora_dir
    finally:
        proc.stop()


def _complete(base_url: str, model: str, prompt: str = PROMPT, max_tokens: int = 8) -> dict:
    r = httpx.post(
        f"{base_url}/v1/completions",
        json={"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def _cached(answer: dict) -> int:
    return (answer["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def test_adapters_are_served_under_their_names_and_listed(lora_server: tuple[ServerProcess, Path]) -> None:
    url = lora_server[0].base_url
    cards = {m["id"]: m for m in httpx.get(f"{url}/v1/models").json()["data"]}
    assert cards[MODEL]["parent"] is None
    assert cards["sql"]["parent"] == MODEL and cards["sql"]["root"] == "adapters/sql"  # vLLM's LoRA card
    base = _complete(url, MODEL)
    assert _cached(_complete(url, MODEL)) > 0  # the base model's blocks of the prompt
    qualified = _complete(url, f"{MODEL}:sql")
    assert _cached(qualified) == 0  # not the base model's blocks
    bare = _complete(url, "sql")
    assert _cached(bare) > 0  # its own
    assert qualified["model"] == f"{MODEL}:sql" and bare["model"] == "sql"
    assert qualified["choices"][0]["text"] == bare["choices"][0]["text"] != base["choices"][0]["text"]


def test_admin_calls_need_the_admin_key_and_name_the_fix(
    lora_server: tuple[ServerProcess, Path], tmp_path: Path
) -> None:
    url, lora_dir = lora_server[0].base_url, lora_server[1]
    load = f"{url}/v1/load_lora_adapter"
    body = {"lora_name": "chat", "lora_path": str(lora_dir / "chat")}
    assert httpx.post(load, json=body).status_code == 401
    assert httpx.post(load, json=body, headers={"authorization": "Bearer wrong"}).status_code == 401
    outside = write_peft_adapter(tmp_path / "elsewhere", seed=3)
    refused = httpx.post(load, json={"lora_name": "x", "lora_path": str(outside)}, headers=ADMIN_HEADERS)
    assert refused.status_code == 400 and "--lora-dir" in refused.json()["error"]["message"]
    taken = httpx.post(load, json={"lora_name": MODEL, "lora_path": str(lora_dir / "chat")}, headers=ADMIN_HEADERS)
    assert taken.status_code == 400 and "served already" in taken.json()["error"]["message"]
    again = httpx.post(load, json={"lora_name": "sql", "lora_path": "adapters/sql"}, headers=ADMIN_HEADERS)
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    missing = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "nope"}, headers=ADMIN_HEADERS)
    assert missing.status_code == 404


def test_hot_load_and_unload_under_traffic_drop_no_request(lora_server: tuple[ServerProcess, Path]) -> None:
    url, lora_dir = lora_server[0].base_url, lora_server[1]
    failures: list[str] = []
    done: list[str] = []
    stop = threading.Event()

    def traffic(model: str) -> None:
        while not stop.is_set():
            try:
                r = httpx.post(
                    f"{url}/v1/completions",
                    json={"model": model, "prompt": "Count: one, two,", "max_tokens": 12, "temperature": 0},
                    timeout=120,
                )
                if r.status_code != 200 or r.json()["choices"][0]["finish_reason"] not in ("length", "stop"):
                    failures.append(f"{model}: {r.status_code} {r.text[:200]}")
                done.append(model)
            except httpx.HTTPError as exc:
                failures.append(f"{model}: {exc!r}")

    threads = [threading.Thread(target=traffic, args=(m,)) for m in (MODEL, MODEL, "sql", "sql")]
    for t in threads:
        t.start()
    try:
        loaded = httpx.post(
            f"{url}/v1/load_lora_adapter",
            headers=ADMIN_HEADERS,
            timeout=60,
            json={"lora_name": "chat", "lora_path": str(lora_dir / "chat")},
        )
        assert loaded.status_code == 200 and loaded.text == "Success: LoRA adapter 'chat' added successfully."
        chat = _complete(url, "chat")
        assert chat["choices"][0]["text"] != _complete(url, MODEL)["choices"][0]["text"]
        assert "chat" in {m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]}
        started, finished = threading.Event(), []

        def long_chat() -> None:  # running under the adapter when it is unloaded: it finishes
            body = {"model": "chat", "prompt": "Count: one, two,", "max_tokens": 40, "temperature": 0, "stream": True}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    started.set()
                    if r.status_code == 200 and line.startswith("data: {"):
                        choices = json.loads(line[6:]).get("choices") or [{}]
                        if choices[0].get("finish_reason") in ("length", "stop"):
                            finished.append(choices[0]["finish_reason"])

        runner = threading.Thread(target=long_chat)
        runner.start()
        assert started.wait(60)
        unloaded = httpx.post(
            f"{url}/v1/unload_lora_adapter", headers=ADMIN_HEADERS, timeout=60, json={"lora_name": "chat"}
        )
        assert unloaded.status_code == 200
        runner.join(60)
        assert finished, "the request running under the unloaded adapter did not finish"
        gone = httpx.post(f"{url}/v1/completions", json={"model": "chat", "prompt": "x", "max_tokens": 1})
        assert gone.status_code == 404
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert not failures, failures[:5]
    assert done.count("sql") >= 2 and done.count(MODEL) >= 2
