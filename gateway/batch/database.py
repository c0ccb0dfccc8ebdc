"""The SQLite database of the Files and Batch APIs: file metadata, batches, and the answers of running batches.

One file beside the stored files (`--files-dir`). As in the Responses store, calls are short and run off the event
loop, one at a time: in one worker thread of their own, so they also run in the order they were made (a batch's
saves land in the order its statuses changed). A batch's
answers are committed one by one as its lines finish, so a restart finds every line that was done and runs only the
others. One server runs the batches of one database: replicas each need their own `--files-dir`.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from gateway.errors import ConfigError

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- upload order, the order of lists and their cursors
    id TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    purpose TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER
);
CREATE INDEX IF NOT EXISTS files_owner ON files (owner, seq);
CREATE INDEX IF NOT EXISTS files_expiry ON files (expires_at);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    status TEXT NOT NULL,
    output_ttl INTEGER,  -- seconds its output and error files are kept (output_expires_after); NULL: 30 days
    object TEXT NOT NULL  -- the Batch object as JSON; request counts and usage are final once it has ended
);
CREATE INDEX IF NOT EXISTS batches_owner ON batches (owner, seq);
CREATE INDEX IF NOT EXISTS batches_status ON batches (status);
CREATE TABLE IF NOT EXISTS batch_results (  -- one row per finished line of a running batch
    batch_id TEXT NOT NULL,
    line INTEGER NOT NULL,  -- 0-based index of the request in the input file
    ok INTEGER NOT NULL,  -- 1: the output file's line; 0: the error file's
    record TEXT NOT NULL,  -- the line written to the output or error file
    input_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    PRIMARY KEY (batch_id, line)
) WITHOUT ROWID;
"""

P = ParamSpec("P")
T = TypeVar("T")


class Database:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: a commit survives the process dying, without an fsync
        self._db.execute("PRAGMA busy_timeout=5000")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            self._db.close()
            raise ConfigError(
                f"{path} was written by another release of Switchyard (schema {version}, this one "
                f"reads {SCHEMA_VERSION}); point --files-dir at a new folder or move the old one away."
            )
        self._db.executescript(SCHEMA + f"PRAGMA user_version = {SCHEMA_VERSION};")
        self._lock = threading.Lock()  # `call` may also be made from other threads (writing output files)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-db")

    def call(self, fn: Callable[Concatenate[sqlite3.Connection, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn(connection, ...)` in one transaction (written at once, or not at all)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                result = fn(self._db, *args, **kwargs)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return result

    async def run(self, fn: Callable[Concatenate[sqlite3.Connection, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`call` in the database's worker thread, after every call made before it."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, partial(self.call, fn, *args, **kwargs))

    def close(self) -> None:
        self._worker.shutdown(wait=True)
        with self._lock:
            self._db.close()


def rows(cursor: sqlite3.Cursor) -> list[dict[str, Any]]:
    """A query's rows as dicts keyed by column name."""
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
