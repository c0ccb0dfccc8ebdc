"""Stored responses (`store: true`) in an embedded SQLite database, so they survive a restart.

Each row keeps the Response object as the client sees it, the conversation as chat messages (what a response
continuing it with `previous_response_id` replays) and the KV session the conversation's turns share. The store
is bounded: rows expire `ttl_seconds` after they were written, and past `max_entries` rows or `max_bytes` of JSON
the oldest go first.
SQLite calls are short and run in a worker thread, one at a time, off the event loop. Background responses are
written when they finish (until then they live in the process, see background.py), so several servers may share
one file.

Each write is one SQLite transaction in WAL mode, so a process killed mid-write (SIGKILL, OOM) leaves the file with
every committed response and nothing of the one in flight; the next start opens it as it is. A write that fails
(the disk is full, an I/O error) is the request's error, in words (507 for a full disk, else 503), and nothing of it
is kept; reads and the rest of the server go on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.errors import InsufficientStorageError, ServiceUnavailableError, SwitchyardError

log = logging.getLogger("switchyard.responses")

SCHEMA_VERSION = 2
SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    expires REAL NOT NULL,
    model TEXT NOT NULL,
    session TEXT NOT NULL,
    owner TEXT NOT NULL,
    response TEXT NOT NULL,
    history TEXT NOT NULL,
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created ON responses (created);
"""


@dataclass
class StoredResponse:
    response: dict[str, Any]  # the Response object
    history: list[dict[str, Any]]  # the conversation up to and including this response, as chat messages
    session: str  # the KV session of the conversation
    model: str
    owner: str  # the API key (its fingerprint) that created it: only that key reads, continues or deletes it


class ResponseStore:
    def __init__(self, path: Path, max_entries: int, ttl_seconds: float, max_bytes: int = 1 << 30) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.max_entries = max_entries
        self.ttl_seconds = ttl_seconds
        self.max_bytes = max_bytes
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")  # readers do not wait for a writer; one fsync per commit
        self._db.execute("PRAGMA busy_timeout=5000")  # several servers may share one file
        if self._db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
            # a file from a release with another layout: its responses cannot be read, so they are dropped
            self._db.executescript(f"DROP TABLE IF EXISTS responses; PRAGMA user_version = {SCHEMA_VERSION};")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _put(self, record: StoredResponse, now: float) -> None:
        response = json.dumps(record.response, ensure_ascii=False)
        history = json.dumps(record.history, ensure_ascii=False)
        row = (
            record.response["id"],
            now,
            now + self.ttl_seconds,
            record.model,
            record.session,
            record.owner,
            response,
            history,
            len(response) + len(history),
        )
        with self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
            self._db.execute("DELETE FROM responses WHERE expires <= ?", (now,))
            self._db.execute(
                "DELETE FROM responses WHERE id IN (SELECT id FROM responses ORDER BY created DESC LIMIT -1 OFFSET ?)",
                (self.max_entries,),
            )
            self._db.execute(
                "DELETE FROM responses WHERE id IN (SELECT id FROM (SELECT id, SUM(size) OVER "
                "(ORDER BY created DESC, id) AS kept FROM responses) WHERE kept > ?)",
                (self.max_bytes,),
            )

    def _get(self, resp_id: str, owner: str, now: float) -> StoredResponse | None:
        with self._lock:
            row = self._db.execute(
                "SELECT response, history, session, model FROM responses WHERE id = ? AND owner = ? AND expires > ?",
                (resp_id, owner, now),
            ).fetchone()
        if row is None:
            return None
        return StoredResponse(json.loads(row[0]), json.loads(row[1]), row[2], row[3], owner)

    def _delete(self, resp_id: str, owner: str) -> bool:
        with self._lock, self._db:
            return self._db.execute("DELETE FROM responses WHERE id = ? AND owner = ?", (resp_id, owner)).rowcount > 0

    async def put(self, record: StoredResponse) -> None:
        try:
            await asyncio.to_thread(self._put, record, time.time())
        except sqlite3.Error as exc:
            raise _failed("store the response", exc) from None

    async def get(self, resp_id: str, owner: str) -> StoredResponse | None:
        try:
            return await asyncio.to_thread(self._get, resp_id, owner, time.time())
        except sqlite3.Error as exc:
            raise _failed("read the stored response", exc) from None

    async def delete(self, resp_id: str, owner: str) -> bool:
        try:
            return await asyncio.to_thread(self._delete, resp_id, owner)
        except sqlite3.Error as exc:
            raise _failed("delete the stored response", exc) from None


def _failed(what: str, exc: sqlite3.Error) -> SwitchyardError:
    """A store failure as the request's error: what failed and why, never the file's path."""
    log.error("the response store could not %s: %s", what, exc)
    if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "full" in str(exc):
        return InsufficientStorageError(
            f"the response store could not {what}: its disk is full. Free space on the "
            "server's store volume, or send store: false"
        )
    return ServiceUnavailableError(
        f"the response store could not {what} ({exc.__class__.__name__}: {exc}); retry later",
        headers={"Retry-After": "5"},
    )
