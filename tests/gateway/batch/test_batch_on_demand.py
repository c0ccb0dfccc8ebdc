"""Batch lines over a model that loads on request, against a real server (--model-control-mode on_demand) with
SmolLM2 and the OpenAI SDK: a batch for a model that is not loaded loads it once for all its lines, every line is
answered, and the model counts no eviction while the lines hold it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.conftest import ServerProcess, smollm2_config

MODEL = "smol"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("batch_on_demand")
    (root / "repo" / MODEL).mkdir(parents=True)
    (root / "repo" / MODEL / "config.yaml").write_text(smollm2_config(2048))
    proc = ServerProcess(
        root / "repo",
        "--model-control-mode",
        "on_demand",
        "--keep-alive",
        "10m",
        "--files-dir",
        str(root / "files"),
        "--batch-max-concurrency",
        "4",
    )
    try:
        yield proc
    finally:
        proc.stop()


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in httpx.get(f"{server.base_url}/metrics").text.splitlines():
        if line.startswith(f"{name}{{{wanted}}} "):
            return float(line.split()[-1])
    return 0.0


def test_a_batch_loads_its_model_on_request(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=120)
    assert (client.models.retrieve(MODEL).model_extra or {}).get("state") == "not-loaded"
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Count to {i}"}],
                "max_tokens": 2,
                "temperature": 0,
            },
        }
        for i in range(6)
    ]
    source = client.files.create(
        file=("lines.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode()), purpose="batch"
    )
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (6, 0), batch.error_file_id
    assert batch.output_file_id is not None
    records = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(r["custom_id"] for r in records) == [f"r{i}" for i in range(6)]
    assert all(r["response"]["status_code"] == 200 for r in records)
    assert metric(server, "switchyard_model_loads_total", model=MODEL, result="success") == 1  # one load for six
    assert metric(server, "switchyard_model_evictions_total", model=MODEL, reason="memory") == 0
    assert (client.models.retrieve(MODEL).model_extra or {}).get("state") == "loaded"
