"""The batch runner over a stand-in for the serving path (the real path is tested end to end in
tests/e2e/test_batch_api.py): files in input order, counts and usage, a restart that runs no line twice, cancel,
expiry, failed validation, the concurrency bound and the hold-back while a model has requests waiting."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gateway.batch.database import Database
from gateway.batch.files import FileStore
from gateway.batch.lines import Answer
from gateway.batch.lock import FolderLock
from gateway.batch.runner import BatchRunner
from gateway.batch.service import BatchCreateRequest, BatchService
from gateway.batch.states import TERMINAL
from gateway.batch.store import BatchStore
from gateway.errors import NotFoundError, ServiceUnavailableError

OWNER = "key-a"


class FakeExecutor:
    """Answers `{"n": i}` bodies: 400 when the body says `fail`, held while `hold` is set for i >= hold_from."""

    def __init__(self, hold_from: int | None = None) -> None:
        self.hold_from = hold_from
        self.release = asyncio.Event()
        self.answered: Counter[int] = Counter()
        self.started: list[int] = []
        self.running = 0
        self.peak = 0
        self.waiting = False  # what busy() says

    async def answer(self, endpoint: str, body: dict[str, Any]) -> Answer:
        n = body["n"]
        self.started.append(n)
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(0.001)
            if self.hold_from is not None and n >= self.hold_from:
                await self.release.wait()
            if body.get("fail"):
                return Answer(
                    400, {"error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": None}}
                )
            self.answered[n] += 1
            return Answer(
                200,
                {
                    "n": n,
                    "usage": {
                        "prompt_tokens": 5,
                        "completion_tokens": 2,
                        "prompt_tokens_details": {"cached_tokens": 1},
                    },
                },
            )
        finally:
            self.running -= 1

    def busy(self, model: str) -> bool:
        return self.waiting


def _service(folder: Path, executor: FakeExecutor, concurrency: int = 4) -> BatchService:
    db = Database(folder / "files.sqlite3")
    files = FileStore(db, folder, 1 << 20)
    store = BatchStore(db)
    runner = BatchRunner(store, files, executor, folder / "batches", concurrency, 1000)  # type: ignore[arg-type]
    return BatchService(db, files, store, runner, FolderLock(folder / "batches.lock"))


def _input(count: int, fail: tuple[int, ...] = ()) -> bytes:
    lines = [
        {
            "custom_id": f"req-{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "n": n, **({"fail": True} if n in fail else {})},
        }
        for n in range(count)
    ]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


async def _create(service: BatchService, data: bytes) -> dict[str, Any]:
    stored = await service.files.upload(OWNER, "batch", "in.jsonl", io.BytesIO(data))
    req = BatchCreateRequest(
        input_file_id=stored.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"team": "search"}
    )
    return await service.create(req, OWNER)


async def _until(service: BatchService, batch_id: str, check: Any, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        batch = await service.get(batch_id, OWNER)
        if check(batch):
            return batch
        assert time.monotonic() < deadline, f"batch stuck: {batch}"
        await asyncio.sleep(0.01)


def _ended(batch: dict[str, Any]) -> bool:
    return batch["status"] in TERMINAL


def _records(service: BatchService, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    path = service.files.objects / file_id
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_a_batch_runs_to_completed_with_its_files(tmp_path: Path) -> None:
    executor = FakeExecutor()
    service = _service(tmp_path, executor)
    created = await _create(service, _input(6, fail=(2,)))
    assert created["status"] == "validating" and created["metadata"] == {"team": "search"}
    batch = await _until(service, created["id"], _ended)
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 6, "completed": 5, "failed": 1}
    assert batch["usage"]["input_tokens"] == 25 and batch["usage"]["output_tokens"] == 10
    assert batch["usage"]["input_tokens_details"]["cached_tokens"] == 5 and batch["usage"]["total_tokens"] == 35
    assert batch["model"] == "m" and batch["errors"] is None
    assert batch["created_at"] <= batch["in_progress_at"] <= batch["finalizing_at"] <= batch["completed_at"]
    output = _records(service, batch["output_file_id"])
    assert [r["custom_id"] for r in output] == ["req-0", "req-1", "req-3", "req-4", "req-5"]  # input order
    assert all(
        r["response"]["status_code"] == 200
        and r["error"] is None
        and r["id"].startswith("batch_req_")
        and r["response"]["request_id"].startswith("req_")
        for r in output
    )
    errors = _records(service, batch["error_file_id"])
    assert [(r["custom_id"], r["response"]["status_code"]) for r in errors] == [("req-2", 400)]
    assert errors[0]["response"]["body"]["error"]["message"] == "bad"
    out_file = await service.files.get(batch["output_file_id"], OWNER)
    assert out_file.purpose == "batch_output" and out_file.filename == f"{batch['id']}_output.jsonl"
    assert not service.runner.input_path(batch["id"]).exists()  # the batch's own input copy is gone
    assert await service.store.done_lines(batch["id"]) == set()  # its line records now live in its files
    assert (await service.page(OWNER, 20, None))["data"][0]["id"] == batch["id"]
    await service.close()


async def test_a_restart_resumes_and_runs_no_line_twice(tmp_path: Path) -> None:
    first = FakeExecutor(hold_from=3)  # lines 0-2 finish; 3 and on hang until the server stops
    service = _service(tmp_path, first, concurrency=2)
    created = await _create(service, _input(8))
    await _until(service, created["id"], lambda b: b["request_counts"]["completed"] == 3)
    await asyncio.sleep(0.05)
    assert first.started[3:] and all(n >= 3 for n in first.started[3:])  # some were in flight
    await service.close()  # the server stops: in-flight lines are aborted, nothing of them kept

    second = FakeExecutor()
    service = _service(tmp_path, second)
    assert [b["status"] for b, _, _ in await service.store.unfinished()] == ["in_progress"]
    await service.start()
    batch = await _until(service, created["id"], _ended)
    assert batch["status"] == "completed" and batch["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
    assert set(first.answered) == {0, 1, 2} and set(second.answered) == set(range(3, 8))  # each line once
    assert [r["custom_id"] for r in _records(service, batch["output_file_id"])] == [f"req-{n}" for n in range(8)]
    await service.close()


async def test_cancel_aborts_what_runs_and_reports_the_rest(tmp_path: Path) -> None:
    executor = FakeExecutor(hold_from=2)
    service = _service(tmp_path, executor, concurrency=2)
    created = await _create(service, _input(6))
    await _until(service, created["id"], lambda b: b["request_counts"]["completed"] == 2)
    cancelling = await service.cancel(created["id"], OWNER)
    assert cancelling["status"] in ("cancelling", "cancelled") and cancelling["cancelling_at"]
    batch = await _until(service, created["id"], _ended)
    assert batch["status"] == "cancelled" and batch["cancelled_at"] >= batch["cancelling_at"]
    assert batch["request_counts"] == {"total": 6, "completed": 2, "failed": 0}
    assert [r["custom_id"] for r in _records(service, batch["output_file_id"])] == ["req-0", "req-1"]
    unrun = _records(service, batch["error_file_id"])
    assert [r["custom_id"] for r in unrun] == ["req-2", "req-3", "req-4", "req-5"]
    assert all(r["response"] is None and r["error"]["code"] == "batch_cancelled" for r in unrun)
    assert (await service.cancel(created["id"], OWNER))["status"] == "cancelled"  # again: a no-op
    await service.close()


async def test_a_batch_past_its_window_expires(tmp_path: Path) -> None:
    executor = FakeExecutor(hold_from=1)
    service = _service(tmp_path, executor, concurrency=1)
    created = await _create(service, _input(3))
    await _until(service, created["id"], lambda b: b["request_counts"]["completed"] == 1)
    service.runner.running(created["id"]).batch["expires_at"] = time.time()  # type: ignore[union-attr]
    batch = await _until(service, created["id"], _ended)
    assert batch["status"] == "expired" and batch["expired_at"]
    assert [r["error"]["code"] for r in _records(service, batch["error_file_id"])] == ["batch_expired"] * 2
    await service.close()


async def test_an_invalid_file_fails_validation_with_line_errors(tmp_path: Path) -> None:
    service = _service(tmp_path, FakeExecutor())
    data = _input(2) + b"not json\n" + _input(1)  # line 3 is broken, line 4 repeats req-0
    created = await _create(service, data)
    batch = await _until(service, created["id"], _ended)
    assert batch["status"] == "failed" and batch["failed_at"] and batch["output_file_id"] is None
    assert batch["errors"]["object"] == "list"
    assert [(e["line"], e["code"]) for e in batch["errors"]["data"]] == [
        (3, "invalid_json_line"),
        (4, "duplicate_custom_id"),
    ]
    await service.close()


async def test_concurrency_is_bounded_and_busy_models_hold_lines_back(tmp_path: Path) -> None:
    executor = FakeExecutor()
    executor.waiting = True
    service = _service(tmp_path, executor, concurrency=3)
    created = await _create(service, _input(20))
    await _until(service, created["id"], lambda b: b["status"] == "in_progress")
    await asyncio.sleep(0.2)
    assert executor.started == []  # requests wait for the model: the batch starts none
    executor.waiting = False
    batch = await _until(service, created["id"], _ended)
    assert batch["request_counts"]["completed"] == 20 and executor.peak <= 3
    await service.close()


async def test_batches_belong_to_their_owner(tmp_path: Path) -> None:
    service = _service(tmp_path, FakeExecutor())
    created = await _create(service, _input(1))
    with pytest.raises(NotFoundError):
        await service.get(created["id"], "key-b")
    with pytest.raises(NotFoundError):
        await service.cancel(created["id"], "key-b")
    assert (await service.page("key-b", 20, None))["data"] == []
    stored = await service.files.upload(OWNER, "batch", "x.jsonl", io.BytesIO(_input(1)))
    with pytest.raises(NotFoundError):  # another key's input file
        await service.create(
            BatchCreateRequest(input_file_id=stored.id, endpoint="/v1/chat/completions", completion_window="24h"),
            "key-b",
        )
    await _until(service, created["id"], _ended)
    await service.close()


async def test_one_server_runs_the_batches_of_a_folder(tmp_path: Path) -> None:
    first = _service(tmp_path, FakeExecutor(hold_from=0))
    created = await _create(first, _input(2))
    second = _service(tmp_path, FakeExecutor())
    await second.start()  # the folder's batches are the first server's: it serves them to read, runs none
    assert (await second.get(created["id"], OWNER))["status"] in ("validating", "in_progress")
    with pytest.raises(ServiceUnavailableError):
        await _create(second, _input(1))
    with pytest.raises(ServiceUnavailableError):
        await second.cancel(created["id"], OWNER)
    await first.close()  # the lock is free: the second server takes over the batch at its next batch request
    batch = await second.cancel(created["id"], OWNER)
    assert batch["status"] in ("cancelling", "cancelled")
    assert (await _until(second, created["id"], _ended))["status"] == "cancelled"
    await second.close()
