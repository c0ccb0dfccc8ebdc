"""Stored files: bytes on disk and metadata in SQLite, per owner, bounded in size, paged, expiring, and kept across
a reopen of the database."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from gateway.batch.database import Database
from gateway.batch.files import FileStore
from gateway.errors import InvalidRequestError, NotFoundError, PayloadTooLargeError


def _store(folder: Path, max_bytes: int = 1 << 20) -> FileStore:
    return FileStore(Database(folder / "files.sqlite3"), folder, max_bytes)


async def test_upload_read_list_delete_and_reopen(tmp_path: Path) -> None:
    files = _store(tmp_path)
    stored = await files.upload("key-a", "batch", "dir/in.jsonl", io.BytesIO(b'{"a": 1}\n'))
    assert stored.filename == "in.jsonl" and stored.bytes == 9 and stored.purpose == "batch"
    assert stored.expires_at == stored.created_at + 30 * 86400  # batch files expire after 30 days, as on OpenAI
    assert files.path(stored).read_bytes() == b'{"a": 1}\n'
    other = await files.upload("key-a", "user_data", "notes.txt", io.BytesIO(b"x" * 10))
    assert other.expires_at is None
    assert (await files.get(stored.id, "key-a")).to_openai()["object"] == "file"
    with pytest.raises(NotFoundError):
        await files.get(stored.id, "key-b")  # another key's file does not exist for it
    with pytest.raises(NotFoundError):
        await files.delete(stored.id, "key-b")
    files.db.close()
    files = _store(tmp_path)  # the same folder after a restart
    assert [f.id for f in (await files.page("key-a"))[0]] == [other.id, stored.id]
    assert [f.id for f in (await files.page("key-a", purpose="batch"))[0]] == [stored.id]
    assert (await files.page("key-b"))[0] == []
    await files.delete(stored.id, "key-a")
    assert not files.path(stored).exists()
    with pytest.raises(NotFoundError):
        await files.get(stored.id, "key-a")


async def test_pages_follow_the_cursor_both_ways(tmp_path: Path) -> None:
    files = _store(tmp_path)
    ids = [(await files.upload("k", "user_data", f"{i}.txt", io.BytesIO(b"x"))).id for i in range(5)]
    page, more = await files.page("k", limit=2)
    assert [f.id for f in page] == ids[4:2:-1] and more
    page, more = await files.page("k", limit=2, after=page[-1].id)
    assert [f.id for f in page] == ids[2:0:-1] and more
    page, more = await files.page("k", limit=2, after=page[-1].id)
    assert [f.id for f in page] == ids[:1] and not more
    page, more = await files.page("k", limit=3, order="asc", after=ids[0])
    assert [f.id for f in page] == ids[1:4] and more
    with pytest.raises(InvalidRequestError):
        await files.page("k", limit=0)
    with pytest.raises(InvalidRequestError):
        await files.page("k", order="sideways")
    with pytest.raises(InvalidRequestError):
        await files.page("other", after=ids[0])  # a cursor of another key's file


async def test_bad_uploads_are_refused_and_leave_nothing(tmp_path: Path) -> None:
    files = _store(tmp_path, max_bytes=1024)
    with pytest.raises(PayloadTooLargeError):
        await files.upload("k", "batch", "big.jsonl", io.BytesIO(b"x" * 1025))
    with pytest.raises(InvalidRequestError, match="purpose"):
        await files.upload("k", "nonsense", "a.jsonl", io.BytesIO(b"x"))
    with pytest.raises(InvalidRequestError, match=r"\.jsonl"):
        await files.upload("k", "batch", "a.csv", io.BytesIO(b"x"))
    with pytest.raises(InvalidRequestError, match="empty"):
        await files.upload("k", "batch", "a.jsonl", io.BytesIO(b""))
    assert list(files.objects.iterdir()) == [] and (await files.page("k"))[0] == []
    assert (await files.upload("k", "batch", "ok.jsonl", io.BytesIO(b"x" * 1024))).bytes == 1024


async def test_expired_files_vanish_and_are_purged(tmp_path: Path) -> None:
    files = _store(tmp_path)
    stored = await files.upload("k", "user_data", "a.txt", io.BytesIO(b"x"), ttl=3600)
    files.db.call(lambda db: db.execute("UPDATE files SET expires_at = ?", (int(time.time()) - 1,)))
    with pytest.raises(NotFoundError):
        await files.get(stored.id, "k")
    assert (await files.page("k"))[0] == []
    assert await files.purge_expired() == 1 and not files.path(stored).exists()


async def test_outputs_are_written_whole_and_replaced_by_id(tmp_path: Path) -> None:
    files = _store(tmp_path)
    first = await files.write_output("file-out", "k", "b_output.jsonl", lambda out: out.write(b"one\n"))
    again = await files.write_output("file-out", "k", "b_output.jsonl", lambda out: out.write(b"one\ntwo\n"))
    assert first.purpose == again.purpose == "batch_output" and again.bytes == 8
    assert files.path(again).read_bytes() == b"one\ntwo\n"
    assert [f.id for f in (await files.page("k"))[0]] == ["file-out"]
    assert [p.name for p in files.objects.iterdir()] == ["file-out"]  # no part file left behind


async def test_a_link_outlives_the_file(tmp_path: Path) -> None:
    files = _store(tmp_path)
    stored = await files.upload("k", "batch", "in.jsonl", io.BytesIO(b"{}\n"))
    copy = tmp_path / "batches" / "batch_x.jsonl"
    files.link(stored, copy)
    await files.delete(stored.id, "k")
    assert copy.read_bytes() == b"{}\n"
