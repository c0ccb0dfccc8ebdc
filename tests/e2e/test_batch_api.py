"""The Files and Batch APIs with the openai SDK against a real server (SmolLM2 and all-MiniLM-L6-v2): upload,
list, read and delete files; a chat batch with a request the endpoint refuses, answered as the same requests sent
over HTTP; an embeddings batch; a file that fails validation; cancel; and two keys that never see each other's
files or batches. One server for the module, which the last test kills mid-batch (SIGKILL) to check that the next
process resumes the batch and runs no line twice."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.conftest import DEFAULT_MODEL, ROOT, ServerProcess, smollm2_config

EMBED = "all-minilm-l6-v2"
KEY = "sk-batch-0123456789"
OTHER_KEY = "sk-batch-other-9876543210"
MAX_FILE = 64 * 1024
QUESTIONS = ["What is the capital of France?", "Name a color.", "Say hello.", "What is 2 + 2?", "Name a fruit."]


@dataclass
class Served:
    """The module's server and what it was started with; the last test kills it and starts another."""

    root: Path
    proc: ServerProcess

    def start(self, *extra: str) -> ServerProcess:
        self.proc = ServerProcess(
            self.root / "repo",
            "--files-dir",
            str(self.root / "files"),
            "--files-max-bytes",
            str(MAX_FILE),
            "--api-key-file",
            str(self.root / "keys"),
            "--batch-max-concurrency",
            "4",
            *extra,
        )
        return self.proc


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("batch")
    repo = root / "repo"
    (repo / DEFAULT_MODEL).mkdir(parents=True)
    (repo / DEFAULT_MODEL / "config.yaml").write_text(smollm2_config(4096))
    shutil.copytree(ROOT / "model_repository" / EMBED, repo / EMBED)
    (root / "keys").write_text(f"{KEY}\n{OTHER_KEY}\n")
    holder = Served(root, None)  # type: ignore[arg-type]
    holder.start()
    try:
        yield holder
    finally:
        holder.proc.stop()


@pytest.fixture(scope="module")
def server(served: Served) -> ServerProcess:
    return served.proc


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def other(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=OTHER_KEY, max_retries=0, timeout=120)


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _chat_line(custom_id: str, question: str, **extra: Any) -> dict[str, Any]:
    body = {
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 8,
        "temperature": 0,
        **extra,
    }
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def _wait(client: openai.OpenAI, batch_id: str, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch}"
        time.sleep(0.2)


def _records(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_files_upload_list_read_delete(client: openai.OpenAI, other: openai.OpenAI) -> None:
    data = _jsonl([_chat_line("a", "hi")])
    created = client.files.create(file=("requests.jsonl", data), purpose="batch")
    assert created.object == "file" and created.bytes == len(data) and created.filename == "requests.jsonl"
    assert created.purpose == "batch" and created.expires_at == created.created_at + 30 * 86400
    assert client.files.retrieve(created.id).id == created.id
    assert created.id in [f.id for f in client.files.list(purpose="batch")]
    assert client.files.content(created.id).content == data
    kept = client.files.create(
        file=("notes.txt", b"plain text"), purpose="user_data", expires_after={"anchor": "created_at", "seconds": 3600}
    )
    assert kept.expires_at == kept.created_at + 3600
    with pytest.raises(openai.NotFoundError):  # another key's file does not exist for it
        other.files.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        other.files.delete(created.id)
    assert created.id not in [f.id for f in other.files.list()]
    deleted = client.files.delete(created.id)
    assert deleted.deleted and deleted.id == created.id
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.id)
    client.files.delete(kept.id)


def test_bad_uploads_get_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as err:
        client.files.create(file=("big.jsonl", b"x" * (MAX_FILE + 1)), purpose="batch")
    assert err.value.status_code == 413 and err.value.body["code"] == "payload_too_large"
    with pytest.raises(openai.BadRequestError) as bad:
        client.files.create(file=("a.jsonl", b"{}"), purpose="nonsense")  # type: ignore[arg-type]
    assert bad.value.body["param"] == "purpose"
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("a.csv", b"{}"), purpose="batch")
    with pytest.raises(openai.BadRequestError) as window:
        client.batches.create(input_file_id="file-x", endpoint="/v1/chat/completions", completion_window="1h")  # type: ignore[arg-type]
    assert window.value.body["param"] == "completion_window"
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-missing", endpoint="/v1/chat/completions", completion_window="24h")


def test_chat_batch_answers_as_http_does(client: openai.OpenAI, other: openai.OpenAI) -> None:
    lines = [_chat_line(f"q{i}", q) for i, q in enumerate(QUESTIONS)]
    lines.insert(3, _chat_line("bad", "hi", max_tokens=-1))  # the endpoint refuses it: a 400 in the error file
    source = client.files.create(file=("chat.jsonl", _jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"team": "search"}
    )
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"team": "search"}
    done = _wait(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None and (
        done.request_counts.total,
        done.request_counts.completed,
        done.request_counts.failed,
    ) == (6, 5, 1)
    assert done.model == DEFAULT_MODEL and done.usage is not None and done.usage.output_tokens > 0
    assert done.in_progress_at and done.finalizing_at and done.completed_at and done.errors is None
    output = _records(client, done.output_file_id)
    assert [r["custom_id"] for r in output] == ["q0", "q1", "q2", "q3", "q4"]
    for record, question in zip(output, QUESTIONS, strict=True):
        assert record["response"]["status_code"] == 200 and record["error"] is None
        direct = client.chat.completions.create(
            model=DEFAULT_MODEL, max_tokens=8, temperature=0, messages=[{"role": "user", "content": question}]
        )
        assert record["response"]["body"]["choices"][0]["message"]["content"] == direct.choices[0].message.content
    assert "Paris" in output[0]["response"]["body"]["choices"][0]["message"]["content"]
    errors = _records(client, done.error_file_id)
    assert [(r["custom_id"], r["response"]["status_code"]) for r in errors] == [("bad", 400)]
    assert errors[0]["response"]["body"]["error"]["param"] == "max_tokens"
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    listed = client.batches.list(limit=100)
    assert batch.id in [b.id for b in listed]
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(done.output_file_id)
    assert batch.id not in [b.id for b in other.batches.list()]


def test_embeddings_batch(client: openai.OpenAI) -> None:
    texts = ["a cat", "hello world", "the stock market fell"]
    lines = [
        {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": {"model": EMBED, "input": text}}
        for i, text in enumerate(texts)
    ]
    source = client.files.create(file=("embed.jsonl", _jsonl(lines)), purpose="batch")
    done = _wait(
        client, client.batches.create(input_file_id=source.id, endpoint="/v1/embeddings", completion_window="24h").id
    )
    assert done.status == "completed" and done.request_counts.completed == 3 and done.error_file_id is None
    direct = client.embeddings.create(model=EMBED, input=texts, encoding_format="float")
    for record, expected in zip(_records(client, done.output_file_id), direct.data, strict=True):
        vector = record["response"]["body"]["data"][0]["embedding"]
        np.testing.assert_allclose(vector, expected.embedding, atol=1e-5)


def test_a_broken_file_fails_validation(client: openai.OpenAI) -> None:
    data = _jsonl([_chat_line("a", "hi")]) + b"{oops\n" + _jsonl([_chat_line("a", "again")])
    source = client.files.create(file=("broken.jsonl", data), purpose="batch")
    done = _wait(
        client,
        client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h").id,
    )
    assert done.status == "failed" and done.failed_at and done.output_file_id is None
    assert done.errors is not None and done.errors.data is not None
    assert [(e.line, e.code) for e in done.errors.data] == [(2, "invalid_json_line"), (3, "duplicate_custom_id")]


def test_cancel_keeps_what_finished(client: openai.OpenAI) -> None:
    lines = [
        _chat_line(f"c{i}", "Write a long story about a dragon.", max_tokens=48, ignore_eos=True) for i in range(24)
    ]
    source = client.files.create(file=("long.jsonl", _jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 60
    while client.batches.retrieve(batch.id).status == "validating":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = _wait(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    counts = done.request_counts
    assert counts is not None and counts.total == 24 and counts.completed < 24
    unrun = [r for r in _records(client, done.error_file_id) if r["error"]]
    assert len(unrun) == 24 - counts.completed - counts.failed
    assert all(r["error"]["code"] == "batch_cancelled" and r["response"] is None for r in unrun)
    assert client.batches.cancel(batch.id).status == "cancelled"  # again: a no-op, as on OpenAI
    one = client.files.create(file=("one.jsonl", _jsonl([_chat_line("x", "hi")])), purpose="batch")
    finished = _wait(
        client, client.batches.create(input_file_id=one.id, endpoint="/v1/chat/completions", completion_window="24h").id
    )
    with pytest.raises(openai.BadRequestError):  # one that has completed cannot be cancelled
        client.batches.cancel(finished.id)


def _requests_finished(server: ServerProcess) -> float:
    text = httpx.get(f"{server.base_url}/metrics").text
    samples = re.findall(
        rf'^switchyard_request_success_total{{[^}}]*model="{DEFAULT_MODEL}"[^}}]*}} (\S+)$', text, re.M
    )
    assert samples, "switchyard_request_success_total is not exposed"
    return sum(float(s) for s in samples)


def test_a_killed_server_resumes_its_batch_without_redoing_lines(served: Served, client: openai.OpenAI) -> None:
    """Each answer carries the second it was made, so the output file tells which process answered each line; the
    new process must have generated exactly the lines it wrote, no more (a line redone would show in its request
    count). Runs last: it replaces the module's server."""
    lines = [_chat_line(f"r{i}", f"Count to {i + 3}.", max_tokens=24, ignore_eos=True) for i in range(16)]
    source = client.files.create(file=("restart.jsonl", _jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 60
    while (client.batches.retrieve(batch.id).request_counts.completed or 0) < 3:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the batch did not progress"
        time.sleep(0.05)
    served.proc.proc.kill()  # no shutdown, no drain: a crash mid-batch
    served.proc.proc.wait()
    killed_at = time.time()
    served.proc.stop()
    time.sleep(1.1)  # answers made after the restart carry a later second than any made before the kill
    restarted_at = time.time()
    server = served.start("--model-control-mode", "explicit", "--load-model", DEFAULT_MODEL)
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0, timeout=120)
    done = _wait(client, batch.id)
    assert done.status == "completed" and done.request_counts is not None
    assert done.request_counts.total == done.request_counts.completed == len(lines)
    records = _records(client, done.output_file_id)
    assert sorted(r["custom_id"] for r in records) == sorted(x["custom_id"] for x in lines)  # each line once
    made = [r["response"]["body"]["created"] for r in records]
    before = [t for t in made if t <= killed_at]
    after = [t for t in made if t >= int(restarted_at)]
    assert len(before) >= 3 and len(before) + len(after) == len(lines), made
    assert _requests_finished(server) == len(after)  # the new process generated only the lines left
