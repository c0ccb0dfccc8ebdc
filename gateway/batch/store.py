"""Batches and the answers of their finished lines, in the database (database.py).

A batch is kept as its Batch object. While it runs, each finished line's output or error record is a row of
`batch_results`, committed as the line finishes: the request counts and token usage shown for a running batch are
counted from those rows, and a restart runs only the lines without one. When the batch ends its records become its
output and error files, its counts and usage are written into the object, and the rows go.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from gateway.batch.database import Database, rows
from gateway.batch.states import TERMINAL
from gateway.errors import InvalidRequestError

MAX_LIST = 100


@dataclass(frozen=True)
class LineResult:
    """A finished line: its record (the JSONL line of the output or error file) and its tokens."""

    line: int
    ok: bool
    record: str
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True)
class Tally:
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0

    def apply(self, batch: dict[str, Any]) -> dict[str, Any]:
        """`batch` with these request counts and usage (OpenAI's BatchRequestCounts and BatchUsage)."""
        total = batch["request_counts"]["total"]
        batch["request_counts"] = {"total": total, "completed": self.completed, "failed": self.failed}
        batch["usage"] = {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.input_tokens + self.output_tokens,
        }
        return batch


def _tally(db: sqlite3.Connection, batch_id: str) -> Tally:
    row = db.execute(
        "SELECT COALESCE(SUM(ok), 0), COUNT(*), COALESCE(SUM(input_tokens), 0), "
        "COALESCE(SUM(cached_tokens), 0), COALESCE(SUM(output_tokens), 0) FROM batch_results "
        "WHERE batch_id = ?",
        (batch_id,),
    ).fetchone()
    return Tally(row[0], row[1] - row[0], row[2], row[3], row[4])


def _shown(db: sqlite3.Connection, row: dict[str, Any]) -> dict[str, Any]:
    batch = json.loads(row["object"])
    return batch if batch["status"] in TERMINAL else _tally(db, batch["id"]).apply(batch)


class BatchStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # The Batch object is written as JSON here, on the event loop, where it changes: never read from another thread.
    async def insert(self, batch: dict[str, Any], owner: str, output_ttl: int | None = None) -> None:
        row = (batch["id"], owner, batch["status"], output_ttl, json.dumps(batch))
        await self.db.run(
            lambda db: db.execute(
                "INSERT INTO batches (id, owner, status, output_ttl, object) VALUES (?, ?, ?, ?, ?)", row
            )
        )

    async def save(self, batch: dict[str, Any]) -> None:
        await self.db.run(_save, batch["id"], batch["status"], json.dumps(batch))

    async def finish(self, batch: dict[str, Any]) -> None:
        """Save an ended batch with its final counts and usage, and drop its line records (now in its files)."""
        snapshot = json.loads(json.dumps(batch))

        def finish(db: sqlite3.Connection) -> dict[str, Any]:
            _tally(db, snapshot["id"]).apply(snapshot)
            _save(db, snapshot["id"], snapshot["status"], json.dumps(snapshot))
            db.execute("DELETE FROM batch_results WHERE batch_id = ?", (snapshot["id"],))
            return snapshot

        batch.update(await self.db.run(finish))

    async def get(self, batch_id: str, owner: str) -> dict[str, Any] | None:
        """The Batch object as its owner sees it now; None for another key's or an unknown id."""

        def get(db: sqlite3.Connection) -> dict[str, Any] | None:
            found = rows(db.execute("SELECT object FROM batches WHERE id = ? AND owner = ?", (batch_id, owner)))
            return _shown(db, found[0]) if found else None

        return await self.db.run(get)

    async def page(self, owner: str, limit: int = 20, after: str | None = None) -> tuple[list[dict[str, Any]], bool]:
        """The owner's batches, newest first, after the batch `after`; and whether more follow."""
        if not 1 <= limit <= MAX_LIST:
            raise InvalidRequestError(f"limit must be between 1 and {MAX_LIST}", param="limit")

        def query(db: sqlite3.Connection) -> list[dict[str, Any]]:
            sql, args = "SELECT object FROM batches WHERE owner = ?", [owner]
            if after:
                found = db.execute("SELECT seq FROM batches WHERE id = ? AND owner = ?", (after, owner)).fetchone()
                if found is None:
                    raise InvalidRequestError(f"No such Batch object: {after[:64]}", param="after")
                sql += " AND seq < ?"
                args.append(found[0])
            return [_shown(db, r) for r in rows(db.execute(sql + " ORDER BY seq DESC LIMIT ?", [*args, limit + 1]))]

        found = await self.db.run(query)
        return found[:limit], len(found) > limit

    async def unfinished(self) -> list[tuple[dict[str, Any], str, int | None]]:
        """Every batch not yet in a terminal status, oldest first, with its owner and output TTL: what a start
        resumes."""
        marks = ", ".join("?" * len(TERMINAL))
        found = await self.db.run(
            lambda db: rows(
                db.execute(
                    f"SELECT object, owner, output_ttl FROM batches WHERE status NOT IN ({marks}) ORDER BY seq",
                    tuple(TERMINAL),
                )
            )
        )
        return [(json.loads(r["object"]), r["owner"], r["output_ttl"]) for r in found]

    # -- line results -------------------------------------------------------------------------------------------
    async def done_lines(self, batch_id: str) -> set[int]:
        found = await self.db.run(
            lambda db: db.execute("SELECT line FROM batch_results WHERE batch_id = ?", (batch_id,)).fetchall()
        )
        return {r[0] for r in found}

    async def put_result(self, batch_id: str, result: LineResult) -> None:
        await self.db.run(
            lambda db: db.execute(
                "INSERT OR IGNORE INTO batch_results VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    batch_id,
                    result.line,
                    int(result.ok),
                    result.record,
                    result.input_tokens,
                    result.cached_tokens,
                    result.output_tokens,
                ),
            )
        )

    async def has_results(self, batch_id: str, ok: bool) -> bool:
        found = await self.db.run(
            lambda db: db.execute(
                "SELECT 1 FROM batch_results WHERE batch_id = ? AND ok = ? LIMIT 1", (batch_id, int(ok))
            ).fetchone()
        )
        return found is not None

    def write_records(
        self, out: IO[bytes], batch_id: str, ok: bool, extra: Iterator[tuple[int, str]] | None = None
    ) -> None:
        """Write the batch's output (`ok`) or error records to `out` in input order, merging `extra` (line,
        record) pairs, in line order, in (the error records of lines that never ran). Runs in a worker thread."""
        extra = extra if extra is not None else iter(())
        pending = next(extra, None)

        def page_after(db: sqlite3.Connection, after: int) -> list[tuple[int, str]]:
            return db.execute(
                "SELECT line, record FROM batch_results WHERE batch_id = ? AND ok = ? AND line > ? "
                "ORDER BY line LIMIT 1000",
                (batch_id, int(ok), after),
            ).fetchall()

        start = -1
        while True:
            page = self.db.call(page_after, start)
            for line, record in page:
                while pending is not None and pending[0] < line:
                    out.write(pending[1].encode() + b"\n")
                    pending = next(extra, None)
                out.write(record.encode() + b"\n")
            if len(page) < 1000:
                break
            start = page[-1][0]
        while pending is not None:
            out.write(pending[1].encode() + b"\n")
            pending = next(extra, None)


def _save(db: sqlite3.Connection, batch_id: str, status: str, text: str) -> None:
    db.execute("UPDATE batches SET status = ?, object = ? WHERE id = ?", (status, text, batch_id))
