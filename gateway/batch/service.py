"""The Batch API's operations (create, retrieve, list, cancel) over the store and the runner, per owner.

Everything a key creates is that key's: its files and batches are invisible to other keys (404, as if they did not
exist). Without API keys every caller is the one anonymous owner.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator
from starlette.requests import Request

from gateway.batch.database import Database
from gateway.batch.files import FileStore, check_ttl
from gateway.batch.input_file import ENDPOINTS
from gateway.batch.lines import LineExecutor
from gateway.batch.lock import FolderLock
from gateway.batch.runner import BatchRunner, Run
from gateway.batch.states import check_cancellable
from gateway.batch.store import BatchStore
from gateway.errors import ConfigError, InvalidRequestError, NotFoundError, ServiceUnavailableError
from gateway.keys.auth import ANONYMOUS
from gateway.repository.registry import ModelRegistry

log = logging.getLogger("switchyard.batch")

COMPLETION_WINDOW = 24 * 3600  # "24h", the only window OpenAI offers
MAX_METADATA = 16


class ExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: StrictInt


class BatchCreateRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    input_file_id: StrictStr = Field(min_length=1, max_length=128)
    endpoint: StrictStr
    completion_window: StrictStr
    metadata: dict[StrictStr, StrictStr] | None = None
    output_expires_after: ExpiresAfter | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return value
        if len(value) > MAX_METADATA:
            raise ValueError(f"at most {MAX_METADATA} metadata keys")
        if any(len(k) > 64 or len(v) > 512 for k, v in value.items()):
            raise ValueError("metadata keys are at most 64 characters and values at most 512")
        return value


def service_of(request: Request) -> BatchService:
    return request.app.state.batch_api


def owner_of(request: Request) -> str:
    """Who is calling (the key's fingerprint; "anonymous" without keys): their files and batches are theirs alone."""
    return getattr(request.state, "principal", ANONYMOUS).key_id


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


class BatchService:
    def __init__(
        self, db: Database, files: FileStore, store: BatchStore, runner: BatchRunner, lock: FolderLock
    ) -> None:
        self.db = db
        self.files = files
        self.store = store
        self.runner = runner
        self.lock = lock

    async def _lead(self) -> None:
        """Become the server that runs this folder's batches (resuming those left unfinished), or 503."""
        if self.lock.held:
            return
        if not self.lock.acquire():
            raise ServiceUnavailableError(
                "another server runs the batches of this --files-dir; send batch requests "
                "to it, or give each server its own --files-dir",
                headers={"Retry-After": "30"},
            )
        await self.runner.resume()

    async def create(self, req: BatchCreateRequest, owner: str) -> dict[str, Any]:
        if req.endpoint not in ENDPOINTS:
            raise InvalidRequestError(
                f"endpoint must be one of {', '.join(ENDPOINTS)}; got '{req.endpoint[:64]}'", param="endpoint"
            )
        if req.completion_window != "24h":
            raise InvalidRequestError("completion_window must be '24h'", param="completion_window")
        output_ttl = check_ttl(req.output_expires_after.seconds) if req.output_expires_after else None
        try:
            source = await self.files.get(req.input_file_id, owner)
        except NotFoundError:
            raise NotFoundError(f"No such File object: {req.input_file_id[:64]}", param="input_file_id") from None
        if source.purpose != "batch":
            raise InvalidRequestError(
                f"the input file's purpose is '{source.purpose}'; upload it with purpose 'batch'", param="input_file_id"
            )
        await self._lead()
        now = int(time.time())
        batch: dict[str, Any] = {
            "id": new_batch_id(),
            "object": "batch",
            "endpoint": req.endpoint,
            "errors": None,
            "input_file_id": source.id,
            "completion_window": "24h",
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None,
            "expires_at": now + COMPLETION_WINDOW,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": req.metadata,
            "model": None,
            "usage": None,
        }
        # the batch reads its own link to the input: deleting the file meanwhile does not take it away
        await asyncio.to_thread(self.files.link, source, self.runner.input_path(batch["id"]))
        await self.store.insert(batch, owner, output_ttl)
        self.runner.start(Run(batch, owner, output_ttl))
        return await self.get(batch["id"], owner)

    async def get(self, batch_id: str, owner: str) -> dict[str, Any]:
        batch = await self.store.get(batch_id, owner)
        if batch is None:
            raise NotFoundError(f"No such Batch object: {batch_id[:64]}", param="batch_id")
        return batch

    async def page(self, owner: str, limit: int, after: str | None) -> dict[str, Any]:
        batches, more = await self.store.page(owner, limit, after)
        return {
            "object": "list",
            "data": batches,
            "first_id": batches[0]["id"] if batches else None,
            "last_id": batches[-1]["id"] if batches else None,
            "has_more": more,
        }

    async def cancel(self, batch_id: str, owner: str) -> dict[str, Any]:
        if check_cancellable(await self.get(batch_id, owner)):  # 404 for another key's; 400 once it has ended
            await self._lead()
            run = self.runner.running(batch_id)
            if run is not None:
                await self.runner.cancel(run)
        return await self.get(batch_id, owner)

    async def start(self) -> None:
        """Forget expired files, and resume the batches a previous run left (unless another server runs them)."""
        await self.files.purge_expired()
        try:
            await self._lead()
        except ServiceUnavailableError:
            log.warning(
                "another server runs the batches of %s: this one serves its files but runs no batch",
                self.files.objects.parent,
            )

    async def close(self) -> None:
        await self.runner.close()
        self.lock.release()
        self.db.close()


def open_service(
    folder: Path,
    registry: ModelRegistry,
    max_file_bytes: int,
    max_requests: int,
    max_concurrency: int,
    accepting: Callable[[], bool],
) -> BatchService:
    """The service over `folder` (its database, `objects/` with the files' bytes, `batches/` with the running
    batches' inputs); nothing runs until `start`."""
    try:
        db = Database(folder / "files.sqlite3")
        files = FileStore(db, folder, max_file_bytes)
    except (OSError, sqlite3.Error) as exc:
        raise ConfigError(
            f"cannot keep files in {folder}: {exc}; point --files-dir at a folder this user may write."
        ) from exc
    store = BatchStore(db)
    runner = BatchRunner(
        store, files, LineExecutor(registry), folder / "batches", max_concurrency, max_requests, accepting
    )
    return BatchService(db, files, store, runner, FolderLock(folder / "batches.lock"))
