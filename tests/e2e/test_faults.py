"""Faults against a real server (docs/reliability.md): overload refusals in each protocol's shape, a model larger
than free memory, the KV pool exhausted by long prompts, a full disk under the Responses store and the log, and a
SIGKILL in the middle of Responses writes followed by a restart.

One small server (SmolLM2, a KV pool of 512 tokens, two sequences at a time) serves the module; its store and its
log are on a small tmpfs (`mount -t tmpfs`, root only: the disk-full test is skipped where mounting is not
permitted). The SIGKILL test comes last: it kills that server and checks the store after a restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import httpx
import openai
import pytest

from engines.pytorch.memory_check import available_memory
from tests.conftest import DEFAULT_MODEL, ServerProcess, smollm2_config

pytestmark = pytest.mark.slow

KV_TOKENS = 512
CONFIG = smollm2_config(KV_TOKENS, "scheduler: {max_num_seqs: 2, max_num_batched_tokens: 512}\n")
TOO_BIG = "too-big"
ADMIN_KEY = "sk-faults-admin-0123456789"
STATE_BYTES = 8 << 20


@dataclass
class Setup:
    repo: Path
    state: Path  # the store and the log (a tmpfs when `mounted`)
    mounted: bool
    server: ServerProcess

    @property
    def store(self) -> Path:
        return self.state / "responses.sqlite3"

    def start(self) -> ServerProcess:
        keys = self.repo.parent / f"{self.repo.name}-admin-key"
        keys.write_text(ADMIN_KEY + "\n")
        with mock.patch.dict(os.environ, {"TMPDIR": str(self.state)}):  # the server's log goes there too
            self.server = ServerProcess(
                self.repo,
                "--responses-store",
                str(self.store),
                "--model-control-mode",
                "explicit",
                "--load-model",
                DEFAULT_MODEL,
                "--admin-key-file",
                str(keys),
                # a budget above the machine's memory: the loader's own check of free
                # memory is what refuses the model too big (the budget's refusal, 503,
                # is tested in test_model_on_demand.py)
                "--memory-budget",
                "1TiB",
                startup_timeout=300,
            )
        return self.server


def _mount_tmpfs(folder: Path, size: int) -> bool:
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _write_sparse_safetensors(path: Path, nbytes: int) -> None:
    """A safetensors file declaring one float32 tensor of about `nbytes`; its data is a hole, so it costs no disk."""
    rows = nbytes // (4 * 16384) + 1
    raw = json.dumps(
        {"model.embed_tokens.weight": {"dtype": "F32", "shape": [rows, 16384], "data_offsets": [0, rows * 16384 * 4]}}
    ).encode()
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + rows * 16384 * 4)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    repo = tmp_path_factory.mktemp("faults_repository")
    (repo / DEFAULT_MODEL).mkdir()
    (repo / DEFAULT_MODEL / "config.yaml").write_text(CONFIG)
    weights = repo / TOO_BIG / "weights"
    weights.mkdir(parents=True)
    (repo / TOO_BIG / "config.yaml").write_text("backend: pytorch\nmodel: weights\ndtype: float32\n")
    (weights / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    room = available_memory()
    _write_sparse_safetensors(weights / "model.safetensors", 4 * (room.bytes if room else 64 << 30))
    state = tmp_path_factory.mktemp("faults_state")
    mounted = _mount_tmpfs(state, STATE_BYTES)
    s = Setup(repo, state, mounted, None)  # type: ignore[arg-type]
    s.start()
    try:
        yield s
    finally:
        s.server.stop()
        if mounted:
            subprocess.run(["umount", "-l", str(state)], check=False, capture_output=True, timeout=30)


def _client(server: ServerProcess, timeout: float = 60) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=timeout)


def _rejected(server: ServerProcess) -> dict[str, float]:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    pattern = rf'^switchyard_requests_rejected_total{{model="{DEFAULT_MODEL}",reason="(\w+)"}} (\S+)$'
    return {reason: float(value) for reason, value in re.findall(pattern, text, re.M)}


@contextlib.contextmanager
def _long_streams(server: ServerProcess, n: int) -> Iterator[list[Iterator[str]]]:
    """`n` streamed completions running (their first token out), closed on exit."""
    with contextlib.ExitStack() as stack:
        lines = []
        for i in range(n):
            resp = stack.enter_context(
                httpx.stream(
                    "POST",
                    f"{server.base_url}/v1/completions",
                    timeout=60,
                    json={
                        "model": DEFAULT_MODEL,
                        "prompt": f"Story {i}:",
                        "max_tokens": 200,
                        "ignore_eos": True,
                        "stream": True,
                    },
                )
            )
            assert resp.status_code == 200
            it = resp.iter_lines()
            next(line for line in it if line.startswith("data: {"))
            lines.append(it)
        yield lines


def test_overload_refusals_carry_retry_after_in_each_protocols_shape_and_spare_running_streams(
    setup: Setup,
) -> None:
    server = setup.server
    before = _rejected(server)
    with _long_streams(server, 2) as running:  # both sequences taken: new requests wait
        chat = httpx.post(
            f"{server.base_url}/v1/chat/completions",
            timeout=30,
            json={
                "model": DEFAULT_MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
                "timeout": 0.3,
            },
        )
        messages = httpx.post(
            f"{server.base_url}/v1/messages",
            timeout=30,
            headers={"X-Request-Timeout": "0.3", "anthropic-version": "2023-06-01"},
            json={"model": DEFAULT_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        )
        v2 = httpx.post(
            f"{server.base_url}/v2/models/{DEFAULT_MODEL}/generate",
            timeout=30,
            json={"text_input": "hi", "max_tokens": 2, "parameters": {"timeout": 300_000}},
        )
        # the running streams go on
        still = [next(line for line in stream if line.startswith("data: {")) for stream in running]
        assert all('"text"' in line and '"error"' not in line for line in still)
    assert chat.status_code == 429 and chat.headers["retry-after"].isdigit(), chat.text
    assert chat.json()["error"]["type"] == "rate_limit_error" and chat.json()["error"]["code"] == "model_overloaded"
    assert "timeout" in chat.json()["error"]["message"]
    assert messages.status_code == 529 and messages.headers["retry-after"].isdigit(), messages.text
    assert messages.json()["type"] == "error" and messages.json()["error"]["type"] == "overloaded_error"
    assert v2.status_code == 429 and v2.headers["retry-after"].isdigit(), v2.text
    assert set(v2.json()) == {"error"}
    after = _rejected(server)
    assert after["queue_timeout"] - before.get("queue_timeout", 0) == 3, after
    # the queue emptied: the next request is served at once
    assert _client(server).completions.create(model=DEFAULT_MODEL, prompt="Next:", max_tokens=2).choices


def test_a_model_larger_than_free_memory_is_refused_at_load_with_the_figures(setup: Setup) -> None:
    load = httpx.post(
        f"{setup.server.base_url}/v2/repository/models/{TOO_BIG}/load",
        json={},
        timeout=60,
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    )
    assert load.status_code == 400, load.text
    figures = r"need about [\d.]+ GiB but only [\d.]+ GiB is available \((MemAvailable|the cgroup memory limit)"
    assert re.search(figures, load.json()["error"]) and "before reading them" in load.json()["error"]
    index = httpx.post(f"{setup.server.base_url}/v2/repository/index", json={}, timeout=10).json()
    (entry,) = [m for m in index if m["name"] == TOO_BIG]
    assert entry["state"] == "UNAVAILABLE" and re.search(figures, entry["reason"]), entry
    ready = httpx.get(f"{setup.server.base_url}/v2/models/{DEFAULT_MODEL}/ready", timeout=10)
    assert ready.status_code == 200  # the other model serves on


def test_the_kv_pool_exhausted_by_long_prompts_preempts_and_fails_nothing(setup: Setup) -> None:
    server = setup.server
    preempted = server.metric("switchyard_num_preemptions_total")

    def one(i: int) -> openai.types.Completion:
        prompt = [100 + (i * 37 + k) % 4000 for k in range(240)]  # two of them fill 480 of the 512 slots
        return _client(server).completions.create(
            model=DEFAULT_MODEL, prompt=prompt, max_tokens=24, extra_body={"ignore_eos": True}
        )

    results: list[object] = [None] * 4
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, one(i))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(r is not None for r in results), results
    assert [(r.choices[0].finish_reason, r.usage.completion_tokens) for r in results] == [("length", 24)] * 4
    assert server.metric("switchyard_num_preemptions_total") > preempted  # decodes outgrew the pool
    assert server.wait_idle()[2] == 0  # every block back


def _fill(folder: Path) -> Path:
    """Write into `folder` until its file system is full; the filler file."""
    filler = folder / "filler"
    with filler.open("wb", buffering=0) as f:
        for size in (256 << 10, 4096, 1):  # big writes, then the last pages
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)
    return filler


def test_a_full_disk_under_the_store_and_the_log_fails_writes_clearly_and_serving_continues(setup: Setup) -> None:
    if not setup.mounted:
        pytest.skip("mounting a tmpfs is not permitted here (needs root)")
    server = setup.server
    client = _client(server)
    kept = client.responses.create(model=DEFAULT_MODEL, input="Say hi.", max_output_tokens=4, store=True)
    filler = _fill(setup.state)
    try:
        with pytest.raises(openai.APIStatusError) as full:
            client.responses.create(model=DEFAULT_MODEL, input="Say hello.", max_output_tokens=4, store=True)
        assert full.value.status_code == 507, full.value
        assert "disk is full" in full.value.message and "store: false" in full.value.message
        with httpx.stream(
            "POST",
            f"{server.base_url}/v1/responses",
            timeout=60,
            json={"model": DEFAULT_MODEL, "input": "Say hey.", "max_output_tokens": 4, "stream": True},
        ) as resp:
            events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
        assert events[-1]["type"] == "error" and "disk is full" in events[-1]["message"], events[-2:]
        # serving goes on: answers that write nothing, reads of the store, with the log's disk full too
        unstored = client.responses.create(model=DEFAULT_MODEL, input="Say yo.", max_output_tokens=4, store=False)
        assert unstored.status in ("completed", "incomplete") and unstored.output_text
        assert client.chat.completions.create(
            model=DEFAULT_MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        ).choices
        assert client.responses.retrieve(kept.id).output_text == kept.output_text
    finally:
        filler.unlink()
    again = client.responses.create(model=DEFAULT_MODEL, input="Say hi again.", max_output_tokens=4, store=True)
    assert client.responses.retrieve(again.id).output_text == again.output_text


def test_sigkill_during_responses_writes_then_restart_keeps_every_acknowledged_response(setup: Setup) -> None:
    server = setup.server
    acknowledged: dict[str, tuple[str, str]] = {}  # id -> (status, text) as the client got them
    stop = threading.Event()

    def writer(k: int) -> None:
        client = _client(server, timeout=30)
        i = 0
        while not stop.is_set():
            try:
                r = client.responses.create(model=DEFAULT_MODEL, input=f"Say {k}-{i}.", max_output_tokens=2, store=True)
            except (openai.APIError, httpx.HTTPError):
                return  # the server is gone
            acknowledged[r.id] = (r.status, r.output_text)
            i += 1

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(acknowledged) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    server.proc.kill()  # SIGKILL, with writes in flight
    server.proc.wait(timeout=30)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert len(acknowledged) >= 6
    server.stop()

    restarted = setup.start()  # the store opens as the kill left it
    client = _client(restarted)
    for resp_id, (status, text) in acknowledged.items():
        got = client.responses.retrieve(resp_id)
        assert (got.status, got.output_text) == (status, text)
    db = sqlite3.connect(setup.store)  # whole rows only: nothing half-written to serve
    try:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        rows = db.execute("SELECT id, response, history FROM responses").fetchall()
    finally:
        db.close()
    assert len(rows) >= len(acknowledged)
    for resp_id, response, history in rows:
        assert json.loads(response)["id"] == resp_id and json.loads(response)["status"] in ("completed", "incomplete")
        assert isinstance(json.loads(history), list)
