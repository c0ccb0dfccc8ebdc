"""Stored files: the bytes under `<files dir>/objects/`, the metadata in the database (database.py).

A file belongs to the API key that uploaded it (or, for a batch's output and error files, that created the batch):
another key neither lists, reads nor deletes it, and gets 404 as if it did not exist. Files of purpose `batch` and
`batch_output` expire after 30 days, as on OpenAI, unless the upload says otherwise (`expires_after`); the others
are kept until deleted. An expired file is gone from every answer at once, and its bytes are removed at the next
upload or start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gateway.batch.database import Database, rows
from gateway.errors import InvalidRequestError, NotFoundError, PayloadTooLargeError

#: purposes an upload may declare (OpenAI's); `batch_output` is written by batches only
UPLOAD_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
OUTPUT_PURPOSE = "batch_output"
DEFAULT_TTL = {"batch": 30 * 86400, OUTPUT_PURPOSE: 30 * 86400}
MIN_TTL, MAX_TTL = 3600, 30 * 86400  # OpenAI's bounds on `expires_after.seconds`
MAX_FILENAME = 255
MAX_LIST = 10_000
COPY_CHUNK = 1 << 20


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


@dataclass(frozen=True)
class StoredFile:
    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    created_at: int
    expires_at: int | None

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's File object."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


def check_ttl(seconds: int) -> int:
    if not MIN_TTL <= seconds <= MAX_TTL:
        raise InvalidRequestError(
            f"expires_after.seconds must be between {MIN_TTL} and {MAX_TTL}", param="expires_after.seconds"
        )
    return seconds


def _row(row: dict[str, Any]) -> StoredFile:
    return StoredFile(
        row["id"], row["owner"], row["purpose"], row["filename"], row["bytes"], row["created_at"], row["expires_at"]
    )


def _alive(now: float) -> str:
    return f"(expires_at IS NULL OR expires_at > {int(now)})"


class FileStore:
    def __init__(self, db: Database, folder: Path, max_bytes: int) -> None:
        self.db = db
        self.objects = folder / "objects"
        self.objects.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes

    def path(self, stored: StoredFile) -> Path:
        return self.objects / stored.id

    # -- writing ------------------------------------------------------------------------------------------------
    async def upload(
        self, owner: str, purpose: str, filename: str, source: IO[bytes], ttl: int | None = None
    ) -> StoredFile:
        """Store an uploaded file (copied from `source` in a worker thread); 413 past `max_bytes`."""
        if purpose not in UPLOAD_PURPOSES:
            raise InvalidRequestError(
                f"'{purpose[:64]}' is not a valid purpose; use one of {', '.join(UPLOAD_PURPOSES)}", param="purpose"
            )
        filename = os.path.basename(filename.replace("\\", "/"))[:MAX_FILENAME] or "upload"
        if purpose == "batch" and not filename.endswith(".jsonl"):
            raise InvalidRequestError("Invalid file format for Batch API. Must be .jsonl", param="file")
        await self.purge_expired()
        file_id = new_file_id()
        size = await asyncio.to_thread(self._copy, source, file_id)
        if size == 0:
            self._unlink(file_id)
            raise InvalidRequestError("the file is empty", param="file")
        return await self._insert(file_id, owner, purpose, filename, size, ttl)

    def _copy(self, source: IO[bytes], file_id: str) -> int:
        part = self.objects / f".{file_id}.part"
        size = 0
        try:
            with part.open("wb") as out:
                while chunk := source.read(COPY_CHUNK):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise PayloadTooLargeError(
                            f"the file exceeds the limit of {self.max_bytes} bytes (--files-max-bytes)", param="file"
                        )
                    out.write(chunk)
            part.replace(self.objects / file_id)
        finally:
            part.unlink(missing_ok=True)
        return size

    async def write_output(
        self, file_id: str, owner: str, filename: str, write: Callable[[IO[bytes]], None], ttl: int | None = None
    ) -> StoredFile:
        """Create (or replace: finishing a batch again after a crash writes the same ids) a `batch_output` file whose
        bytes `write` produces, in a worker thread."""

        def produce() -> int:
            part = self.objects / f".{file_id}.part"
            try:
                with part.open("wb") as out:
                    write(out)
                size = part.stat().st_size
                part.replace(self.objects / file_id)
            finally:
                part.unlink(missing_ok=True)
            return size

        size = await asyncio.to_thread(produce)
        return await self._insert(file_id, owner, OUTPUT_PURPOSE, filename, size, ttl)

    async def _insert(
        self, file_id: str, owner: str, purpose: str, filename: str, size: int, ttl: int | None
    ) -> StoredFile:
        now = int(time.time())
        ttl = ttl if ttl is not None else DEFAULT_TTL.get(purpose)
        stored = StoredFile(file_id, owner, purpose, filename, size, now, now + ttl if ttl is not None else None)

        def insert(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM files WHERE id = ?", (file_id,))
            db.execute(
                "INSERT INTO files (id, owner, purpose, filename, bytes, created_at, expires_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (file_id, owner, purpose, filename, size, now, stored.expires_at),
            )

        try:
            await self.db.run(insert)
        except BaseException:
            self._unlink(file_id)
            raise
        return stored

    # -- reading ------------------------------------------------------------------------------------------------
    async def get(self, file_id: str, owner: str) -> StoredFile:
        """The caller's file; 404 when it does not exist, expired, or is another key's."""
        found = await self.db.run(
            lambda db: rows(
                db.execute(
                    f"SELECT * FROM files WHERE id = ? AND owner = ? AND {_alive(time.time())}", (file_id, owner)
                )
            )
        )
        if not found:
            raise NotFoundError(f"No such File object: {file_id[:64]}", param="file_id")
        return _row(found[0])

    async def page(
        self,
        owner: str,
        purpose: str | None = None,
        limit: int = MAX_LIST,
        order: str = "desc",
        after: str | None = None,
    ) -> tuple[list[StoredFile], bool]:
        """One page of the caller's files in upload order (`desc`: newest first) after the file `after`, and
        whether more follow."""
        if not 1 <= limit <= MAX_LIST:
            raise InvalidRequestError(f"limit must be between 1 and {MAX_LIST}", param="limit")
        if order not in ("asc", "desc"):
            raise InvalidRequestError("order must be 'asc' or 'desc'", param="order")

        def query(db: sqlite3.Connection) -> list[dict[str, Any]]:
            sql = f"SELECT * FROM files WHERE owner = ? AND {_alive(time.time())}"
            args: list[Any] = [owner]
            if purpose:
                sql += " AND purpose = ?"
                args.append(purpose)
            if after:
                cursor = db.execute("SELECT seq FROM files WHERE id = ? AND owner = ?", (after, owner)).fetchone()
                if cursor is None:
                    raise InvalidRequestError(f"No such File object: {after[:64]}", param="after")
                sql += " AND seq < ?" if order == "desc" else " AND seq > ?"
                args.append(cursor[0])
            sql += f" ORDER BY seq {'DESC' if order == 'desc' else 'ASC'} LIMIT ?"
            args.append(limit + 1)
            return rows(db.execute(sql, args))

        found = [_row(r) for r in await self.db.run(query)]
        return found[:limit], len(found) > limit

    # -- removing -----------------------------------------------------------------------------------------------
    async def delete(self, file_id: str, owner: str) -> None:
        """Delete the caller's file (404 if it has none of that id). A batch reading it keeps its own link."""
        stored = await self.get(file_id, owner)
        await self.db.run(lambda db: db.execute("DELETE FROM files WHERE id = ?", (stored.id,)))
        self._unlink(stored.id)

    async def purge_expired(self) -> int:
        """Remove expired files (rows and bytes); how many went."""

        def purge(db: sqlite3.Connection) -> list[str]:
            now = int(time.time())
            ids = [r[0] for r in db.execute("SELECT id FROM files WHERE expires_at <= ?", (now,)).fetchall()]
            db.execute("DELETE FROM files WHERE expires_at <= ?", (now,))
            return ids

        ids = await self.db.run(purge)
        for file_id in ids:
            self._unlink(file_id)
        return len(ids)

    def _unlink(self, file_id: str) -> None:
        with contextlib.suppress(OSError):
            (self.objects / file_id).unlink()

    def link(self, stored: StoredFile, target: Path) -> None:
        """Give `target` the file's bytes without copying where the file system allows (a hard link): the copy
        stays when the file is deleted."""
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        try:
            os.link(self.path(stored), target)
        except OSError:
            shutil.copyfile(self.path(stored), target)
