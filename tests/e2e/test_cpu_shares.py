"""Threads per model in one server (the default repository: SmolLM2 on the native engine and all-MiniLM-L6-v2 on
transformers): while the LLM streams an answer, the embedding model's batches run on its share of the CPU (torch
threads set on its own batch thread), and the LLM's steps stay on one torch thread (its kernels have their own).
Read through switchyard_model_cpu_threads and switchyard_model_torch_threads."""

from __future__ import annotations

import re
import threading

import httpx

from tests.conftest import DEFAULT_MODEL, ServerProcess, metric_sample

EMBED = "all-minilm-l6-v2"


def test_an_embedding_model_beside_a_busy_llm_runs_on_its_share(server: ServerProcess) -> None:
    def chat() -> None:
        body = {
            "model": DEFAULT_MODEL,
            "messages": [{"role": "user", "content": "Count from one to fifty."}],
            "max_tokens": 48,
            "stream": True,
        }
        with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            for _ in r.iter_lines():
                pass

    busy = threading.Thread(target=chat)
    busy.start()
    try:
        for i in range(4):
            r = httpx.post(
                f"{server.base_url}/v1/embeddings",
                json={"model": EMBED, "input": [f"text {i}", "a cat", "a dog"], "encoding_format": "float"},
                timeout=60,
            )
            assert r.status_code == 200, r.text
    finally:
        busy.join(120)
    metrics = httpx.get(f"{server.base_url}/metrics").text
    found = re.search(r"^switchyard_cpu_budget_threads\{[^}]*\} (\S+)$", metrics, re.M)
    assert found, "no CPU budget in /metrics"
    budget = float(found.group(1))
    # no share in the default configs: the whole budget each (docs/cpu.md#threads-per-model)
    assert metric_sample(metrics, "switchyard_model_cpu_threads", EMBED) == budget
    assert metric_sample(metrics, "switchyard_model_torch_threads", EMBED) == budget  # torch ran its batch so
    assert metric_sample(metrics, "switchyard_model_cpu_threads", DEFAULT_MODEL) == budget
    assert metric_sample(metrics, "switchyard_model_torch_threads", DEFAULT_MODEL) == 1  # its own thread kept 1
