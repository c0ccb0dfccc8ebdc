"""Models on demand end to end (--model-control-mode=on_demand): one real server over three SmolLM2 folders whose
KV pools are counted whole against a memory budget that fits one of them.

* nothing loads at startup; /v1/models lists every model with its state;
* 16 concurrent first requests through the OpenAI SDK are all answered after exactly one load (the metrics count);
* asking for the second model evicts the first, idle one (LRU, counted by reason); KServe v2 brings it back;
* a model that cannot fit even alone is refused with the figures, on the request and in the repository index.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.conftest import ServerProcess, smollm2_config

# 65536 tokens x 46 KB = 3.0 GB of KV pool per model, counted whole by the budget but faulted in only as used: the
# budget fits one model (about 3.2 GB with its weights, beside a server of at most ~2 GB) and not two.
BUDGET = "5500MB"
FITS_ONE = smollm2_config(65536, "scheduler:\n  max_num_seqs: 16\n")
TOO_LARGE = smollm2_config(262144)  # 12 GB of KV pool


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("on_demand")
    for name, config in (("smol-a", FITS_ONE), ("smol-b", FITS_ONE), ("smol-huge", TOO_LARGE)):
        (repo / name).mkdir()
        (repo / name / "config.yaml").write_text(config)
    proc = ServerProcess(repo, "--model-control-mode", "on_demand", "--memory-budget", BUDGET, "--keep-alive", "10m")
    try:
        yield proc
    finally:
        proc.stop()


def sample(server: ServerProcess, name: str, **labels: str) -> float:
    """One sample of /metrics with exactly these labels (0 when absent: a counter not yet incremented)."""
    text = httpx.get(f"{server.base_url}/metrics").text
    wanted = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
    match = re.search(rf"^{name}{re.escape(wanted)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def states(server: ServerProcess) -> dict[str, str]:
    body = httpx.get(f"{server.base_url}/v1/models").json()
    return {card["id"]: card["state"] for card in body["data"]}


def chat(server: ServerProcess, model: str) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/v1/chat/completions",
        timeout=120,
        json={"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    )


def test_nothing_loads_at_startup_and_every_model_is_listed(server: ServerProcess) -> None:
    assert states(server) == {"smol-a": "not-loaded", "smol-b": "not-loaded", "smol-huge": "not-loaded"}
    assert openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x").models.retrieve("smol-a").id == "smol-a"


def test_concurrent_first_requests_cause_one_load(server: ServerProcess) -> None:
    client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", timeout=120)

    async def ask(i: int) -> str:
        reply = await client.chat.completions.create(
            model="smol-a", messages=[{"role": "user", "content": f"Count to {i}"}], max_tokens=2
        )
        return reply.choices[0].finish_reason  # answered (two tokens may be empty text)

    async def all_at_once() -> list[str]:
        try:
            return await asyncio.gather(*(ask(i) for i in range(16)))
        finally:
            await client.close()

    answers = asyncio.run(all_at_once())
    assert len(answers) == 16 and set(answers) <= {"stop", "length"}
    assert sample(server, "switchyard_model_loads_total", model="smol-a", result="success") == 1
    assert sample(server, "switchyard_model_load_seconds_count", model="smol-a") == 1
    assert sample(server, "switchyard_model_resident_bytes", model="smol-a") > 3e9  # the KV pool, counted whole
    assert states(server)["smol-a"] == "loaded"


def test_the_idle_model_is_evicted_for_another(server: ServerProcess) -> None:
    assert chat(server, "smol-a").status_code == 200  # loaded by the test before, or now
    response = chat(server, "smol-b")
    assert response.status_code == 200, response.text
    assert states(server) | {"smol-huge": ""} == {"smol-a": "not-loaded", "smol-b": "loaded", "smol-huge": ""}
    assert sample(server, "switchyard_model_evictions_total", model="smol-a", reason="memory") == 1
    assert sample(server, "switchyard_memory_used_bytes") <= sample(server, "switchyard_memory_budget_bytes")
    # another protocol asks for the first one back: it loads again, and the second one makes room
    generated = httpx.post(
        f"{server.base_url}/v2/models/smol-a/generate",
        timeout=120,
        json={"text_input": "Hello", "parameters": {"max_tokens": 2}},
    )
    assert generated.status_code == 200, generated.text
    assert sample(server, "switchyard_model_evictions_total", model="smol-b", reason="memory") == 1
    assert sample(server, "switchyard_model_loads_total", model="smol-a", result="success") == 2


def test_a_model_too_large_for_the_budget_is_refused_with_the_figures(server: ServerProcess) -> None:
    response = chat(server, "smol-huge")
    assert response.status_code == 503, response.text
    message = response.json()["error"]["message"]
    assert "needed:" in message and "budget: 5500000000 bytes" in message, message
    index = httpx.post(f"{server.base_url}/v2/repository/index", json={}).json()
    [row] = [r for r in index if r["name"] == "smol-huge"]
    assert row["state"] == "UNAVAILABLE" and "budget: 5500000000 bytes" in row["reason"]
    assert states(server)["smol-huge"] == "failed"
