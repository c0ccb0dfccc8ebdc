"""The stored-responses database: round trip, expiry, the bound on entries, and reopening the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import InsufficientStorageError
from gateway.responses.store import ResponseStore, StoredResponse


def _record(resp_id: str) -> StoredResponse:
    return StoredResponse(
        {"id": resp_id, "object": "response", "output": []},
        [{"role": "user", "content": f"question {resp_id}"}],
        f"resp-{resp_id}",
        "m",
        "key-a",
    )


async def test_round_trip_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "responses.sqlite3"
    store = ResponseStore(path, max_entries=10, ttl_seconds=60)
    await store.put(_record("resp_a"))
    got = await store.get("resp_a", "key-a")
    assert got == _record("resp_a")
    assert await store.get("resp_a", "key-b") is None  # another key does not see it
    assert await store.delete("resp_a", "key-b") is False
    store.close()
    reopened = ResponseStore(path, max_entries=10, ttl_seconds=60)
    assert await reopened.get("resp_a", "key-a") == _record("resp_a")
    assert await reopened.delete("resp_a", "key-a") is True
    assert await reopened.delete("resp_a", "key-a") is False
    assert await reopened.get("resp_a", "key-a") is None
    reopened.close()


async def test_expired_rows_are_not_served_and_are_removed(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "r.sqlite3", max_entries=10, ttl_seconds=100)
    store._put(_record("resp_old"), now=1000.0)
    assert store._get("resp_old", "key-a", now=1099.0) is not None
    assert store._get("resp_old", "key-a", now=1100.0) is None  # expired
    store._put(_record("resp_new"), now=1200.0)  # writing sweeps expired rows
    assert store._db.execute("SELECT id FROM responses").fetchall() == [("resp_new",)]
    store.close()


async def test_oldest_go_first_past_the_bound(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "r.sqlite3", max_entries=3, ttl_seconds=1e9)
    for i in range(5):
        store._put(_record(f"resp_{i}"), now=1000.0 + i)
    assert [store._get(f"resp_{i}", "key-a", now=2000.0) is not None for i in range(5)] == [
        False,
        False,
        True,
        True,
        True,
    ]
    store.close()


async def test_oldest_go_first_past_the_byte_bound(tmp_path: Path) -> None:
    one = len('{"id": "resp_0", "object": "response", "output": []}') + len(
        '[{"role": "user", "content": "question resp_0"}]'
    )
    store = ResponseStore(tmp_path / "r.sqlite3", max_entries=100, ttl_seconds=1e9, max_bytes=2 * one)
    for i in range(4):
        store._put(_record(f"resp_{i}"), now=1000.0 + i)
    assert [store._get(f"resp_{i}", "key-a", now=2000.0) is not None for i in range(4)] == [False, False, True, True]
    store.close()


def test_a_file_of_another_layout_is_started_afresh(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "r.sqlite3"
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE responses (id TEXT PRIMARY KEY, response TEXT)")
    old.commit()
    old.close()
    store = ResponseStore(path, max_entries=10, ttl_seconds=60)
    store._put(_record("resp_a"), now=1.0)
    assert store._get("resp_a", "key-a", now=2.0) == _record("resp_a")
    store.close()


async def test_a_full_database_is_a_clear_507_and_keeps_what_it_had(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "r.sqlite3", max_entries=1000, ttl_seconds=1e9)
    await store.put(_record("resp_kept"))
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")  # the file cannot grow: as a full disk answers SQLite
    big = _record("resp_big")
    big.history = [{"role": "user", "content": "x" * 200_000}]
    with pytest.raises(InsufficientStorageError) as full:
        await store.put(big)
    assert full.value.status == 507 and "disk is full" in full.value.message and "store: false" in full.value.message
    assert str(tmp_path) not in full.value.message  # no paths in errors
    assert await store.get("resp_big", "key-a") is None  # nothing half-written
    assert await store.get("resp_kept", "key-a") == _record("resp_kept")  # reads go on
    store._db.execute("PRAGMA max_page_count = 1073741823")  # space again: writes go on
    await store.put(big)
    assert (await store.get("resp_big", "key-a")) == big
    store.close()
