"""Runs batches: validates the input, answers its lines in the background, writes the output and error files.

Lines fill idle capacity: all batches together hold at most `max_concurrency` requests at once, and a line is
handed to a model only while no request waits for admission there (its scheduler's queue is empty) and the server is
not draining. Its generation requests carry the lowest priority (lines.py), so a chat that arrives while batch lines
run is admitted ahead of every line still waiting.

Each finished line's record is committed at once (store.py). When the server stops, the lines in flight are
aborted and nothing of them is kept; at the next start every batch not yet ended resumes from its status, and a
batch in progress runs only its lines without a record, so a line that was done is never run again. Cancelling
aborts the lines in flight; a batch not done by its `expires_at` expires the same way; either way the lines that
never ran go to the error file with `batch_cancelled` or `batch_expired`, as on OpenAI.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.batch.files import FileStore
from gateway.batch.input_file import RequestLine, requests, validate
from gateway.batch.lines import LineExecutor, answer_record, unrun_record
from gateway.batch.states import TERMINAL, advance, check_cancellable
from gateway.batch.store import BatchStore, LineResult

log = logging.getLogger("switchyard.batch")

POLL_SECONDS = 0.02  # how often a batch held back (busy model, no free slot) looks again
READ_CHUNK = 256  # input lines read per trip to a worker thread
UNRUN = {
    "cancelled": ("batch_cancelled", "This request was not executed because the batch was cancelled."),
    "expired": ("batch_expired", "This request could not be executed before the completion window expired."),
}


@dataclass
class Run:
    """A batch this process is running: the Batch object (saved on each status change) and its stop signal."""

    batch: dict[str, Any]
    owner: str
    output_ttl: int | None
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # set by cancel, or when a record cannot be kept
    task: asyncio.Task[None] | None = None
    error: Exception | None = None  # why a line's record could not be kept: the batch fails

    @property
    def id(self) -> str:
        return self.batch["id"]

    @property
    def expired(self) -> bool:
        return time.time() >= self.batch["expires_at"]


def output_file_id(batch_id: str, kind: str) -> str:
    """The id of a batch's output or error file: derived from the batch, so finishing a batch again after a crash
    replaces the files instead of leaving strays."""
    return "file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:24]


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        files: FileStore,
        executor: LineExecutor,
        folder: Path,
        max_concurrency: int,
        max_requests: int,
        accepting: Callable[[], bool] = lambda: True,
    ) -> None:
        """`folder`: where each batch keeps its own link to its input file; `accepting`: False while the server
        drains (no new line starts)."""
        self.store = store
        self.files = files
        self.executor = executor
        self.folder = folder
        self.max_requests = max_requests
        self.accepting = accepting
        self._slots = asyncio.Semaphore(max_concurrency)
        self._runs: dict[str, Run] = {}

    def input_path(self, batch_id: str) -> Path:
        return self.folder / f"{batch_id}.jsonl"

    # -- control ------------------------------------------------------------------------------------------------
    async def resume(self) -> None:
        """Start every batch that had not ended when the server last stopped."""
        unfinished = await self.store.unfinished()
        for batch, owner, output_ttl in unfinished:
            log.info("resuming batch %s (%s)", batch["id"], batch["status"])
            self.start(Run(batch, owner, output_ttl))

    def start(self, run: Run) -> None:
        self._runs[run.id] = run
        # A context of its own: not the creating request's (its request id, trace and rate-limit account), which
        # a batch resumed after a restart would not have either.
        run.task = asyncio.create_task(self._drive(run), name=f"batch {run.id}", context=contextvars.Context())

    def running(self, batch_id: str) -> Run | None:
        return self._runs.get(batch_id)

    async def cancel(self, run: Run) -> None:
        """Move a running batch to `cancelling` (400 when it is finishing; nothing when it is already cancelling);
        its task aborts the lines in flight and finishes it."""
        if not check_cancellable(run.batch):
            return
        advance(run.batch, "cancelling", int(time.time()))
        await self.store.save(run.batch)
        run.stop.set()

    async def close(self) -> None:
        """Stop every batch where it is (server shutdown): the next start resumes them."""
        tasks = [run.task for run in self._runs.values() if run.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- one batch ----------------------------------------------------------------------------------------------
    async def _drive(self, run: Run) -> None:
        try:
            while run.batch["status"] not in TERMINAL:
                status = run.batch["status"]
                if status == "validating":
                    await self._validate(run)
                elif status == "in_progress":
                    await self._run_lines(run)
                else:  # finalizing or cancelling
                    await self._finish(run, "completed" if status == "finalizing" else "cancelled")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("batch %s failed", run.id)
            await self._fail(
                run,
                [
                    {
                        "code": "internal_error",
                        "message": f"the batch could not go on: {type(exc).__name__}; see the server log",
                        "param": None,
                        "line": None,
                    }
                ],
            )
        finally:
            self._runs.pop(run.id, None)

    async def _validate(self, run: Run) -> None:
        batch = run.batch
        path = self.input_path(run.id)

        def check() -> Any:
            with path.open("rb") as lines:
                return validate(lines, batch["endpoint"], self.max_requests)

        validation = await asyncio.to_thread(check)
        if batch["status"] != "validating":  # cancelled meanwhile
            return
        if run.expired:
            await self._finish(run, "expired")
            return
        if not validation.ok:
            await self._fail(run, [e.to_openai() for e in validation.errors])
            return
        batch["request_counts"] = {"total": validation.total, "completed": 0, "failed": 0}
        batch["model"] = next(iter(validation.models)) if len(validation.models) == 1 else None
        advance(batch, "in_progress", int(time.time()))
        await self.store.save(batch)

    async def _fail(self, run: Run, errors: list[dict[str, Any]]) -> None:
        run.batch["errors"] = {"object": "list", "data": errors}
        advance(run.batch, "failed", int(time.time()))
        await self.store.finish(run.batch)
        self.input_path(run.id).unlink(missing_ok=True)

    async def _run_lines(self, run: Run) -> None:
        done = await self.store.done_lines(run.id)
        in_flight: set[asyncio.Task[None]] = set()
        try:
            async with contextlib.aclosing(self._pending(run, done)) as pending:
                async for line in pending:
                    if not await self._turn(run, line.body["model"]):
                        break
                    task = asyncio.create_task(self._line(run, line))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
            while in_flight and not run.stop.is_set() and not run.expired:
                await asyncio.wait(
                    in_flight,
                    timeout=max(0.0, min(1.0, run.batch["expires_at"] - time.time())),
                    return_when=asyncio.FIRST_COMPLETED,
                )
        finally:
            for task in in_flight:  # cancelled, expired, failed or shutting down: abort what still runs
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
        if run.error is not None:
            raise run.error
        if run.batch["status"] != "in_progress":  # cancelling: the loop finishes it
            return
        if run.expired:
            await self._finish(run, "expired")
            return
        advance(run.batch, "finalizing", int(time.time()))
        await self.store.save(run.batch)

    async def _pending(self, run: Run, done: set[int]) -> AsyncGenerator[RequestLine, None]:
        """The batch's requests that have no record yet, read from its input in a worker thread."""
        with self.input_path(run.id).open("rb") as lines:
            found = requests(lines, run.batch["endpoint"])
            while chunk := await asyncio.to_thread(lambda: list(itertools.islice(found, READ_CHUNK))):
                for line in chunk:
                    if line.index not in done:
                        yield line

    async def _turn(self, run: Run, model: str) -> bool:
        """Wait until a line for `model` may start, and take a slot; False when the batch must stop instead."""
        while True:
            if run.stop.is_set() or run.expired:
                return False
            if self.accepting() and not self._slots.locked() and not self.executor.busy(model):
                await self._slots.acquire()
                return True
            await asyncio.sleep(POLL_SECONDS)

    async def _line(self, run: Run, line: RequestLine) -> None:
        try:
            answer = await self.executor.answer(run.batch["endpoint"], line.body)
            result = LineResult(line.index, answer.ok, answer_record(line.custom_id, answer), *answer.tokens())
            write = asyncio.ensure_future(self.store.put_result(run.id, result))
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:  # the record is being committed: let it land before the batch finishes
                await write
                raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the record could not be kept (disk full?): the batch cannot go on
            run.error = run.error or exc
            run.stop.set()
        finally:
            self._slots.release()

    async def _finish(self, run: Run, final: str) -> None:
        """Write the output and error files, then end the batch in `final` (completed, cancelled or expired)."""
        batch = run.batch
        done = await self.store.done_lines(run.id)
        total = batch["request_counts"]["total"]
        unrun = final in UNRUN and batch.get("in_progress_at") is not None and len(done) < total
        if await self.store.has_results(run.id, ok=True):
            batch["output_file_id"] = await self._write(run, "output", ok=True)
        if unrun or await self.store.has_results(run.id, ok=False):
            batch["error_file_id"] = await self._write(
                run, "error", ok=False, unrun=(done, *UNRUN[final]) if unrun else None
            )
        advance(batch, final, int(time.time()))
        await self.store.finish(batch)
        self.input_path(run.id).unlink(missing_ok=True)
        counts = batch["request_counts"]
        log.info(
            "batch %s %s: %d completed, %d failed of %d",
            run.id,
            final,
            counts["completed"],
            counts["failed"],
            counts["total"],
        )

    async def _write(self, run: Run, kind: str, ok: bool, unrun: tuple[set[int], str, str] | None = None) -> str:
        path = self.input_path(run.id)

        def write(out: Any) -> None:
            with contextlib.ExitStack() as stack:
                extra: Iterator[tuple[int, str]] | None = None
                if unrun is not None:
                    done, code, message = unrun
                    lines = stack.enter_context(path.open("rb"))
                    extra = (
                        (r.index, unrun_record(r.custom_id, code, message))
                        for r in requests(lines, run.batch["endpoint"])
                        if r.index not in done
                    )
                self.store.write_records(out, run.id, ok, extra)

        file_id = output_file_id(run.id, kind)
        await self.files.write_output(file_id, run.owner, f"{run.id}_{kind}.jsonl", write, run.output_ttl)
        return file_id
