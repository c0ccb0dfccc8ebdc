"""The key store on SQLite: keys kept as digests, usage added in place per key, model and hour, period totals."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import ConfigError
from gateway.keys.policy import KeyPolicy, KeyRecord
from gateway.keys.store import KeyDatabase, UsageCounts


def record(key_id: str, created: float = 1.0) -> KeyRecord:
    return KeyRecord(
        key_id,
        "name-" + key_id,
        "digest-" + key_id,
        "sk-sy-abc",
        KeyPolicy(models=("m",), rpm=5),
        {"team": "t"},
        created,
        created,
    )


def test_keys_round_trip_and_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "keys.sqlite3"
    db = KeyDatabase.open(path)
    db.insert(record("key_1"))
    db.insert(record("key_2", created=2.0))
    changed = record("key_1")
    changed.policy, changed.revoked_at = KeyPolicy(tpm=7), 9.0
    db.save(changed)
    db.close()
    again = KeyDatabase.open(path)
    keys = again.keys()
    assert [k.id for k in keys] == ["key_1", "key_2"]
    assert keys[0].policy.tpm == 7 and keys[0].revoked_at == 9.0 and keys[1].metadata == {"team": "t"}
    assert again.get("key_2").policy.models == ("m",) and again.get("missing") is None


def test_usage_is_added_per_key_model_and_hour(tmp_path: Path) -> None:
    db = KeyDatabase.open(tmp_path / "k.sqlite3")
    db.add_usage({("key_1", "m", 3600): UsageCounts(1, 0, 10, 2, 5, 0.5)})
    db.add_usage({("key_1", "m", 3600): UsageCounts(2, 1, 20, 0, 7, 0.25), ("key_1", "m", 7200): UsageCounts(1)})
    db.add_usage({("key_2", "other", 3600): UsageCounts(1, 0, 3, 0, 4)})
    rows = db.usage_rows(None, None, None, None)
    assert [(k, m, h) for k, m, h, _ in rows] == [("key_1", "m", 3600), ("key_2", "other", 3600), ("key_1", "m", 7200)]
    first = rows[0][3]
    assert (first.requests, first.errors, first.prompt_tokens, first.cached_tokens, first.completion_tokens) == (
        3,
        1,
        30,
        2,
        12,
    )
    assert first.cost == pytest.approx(0.75)
    assert [r[:3] for r in db.usage_rows(["key_1"], "m", 4000, None)] == [("key_1", "m", 3600), ("key_1", "m", 7200)]
    assert db.usage_rows(["key_1"], None, None, 7200) == rows[:1]
    assert db.period_totals({"key_1": 0.0, "key_2": 7200.0}) == {"key_1": (42, 0.75)}


def test_a_bad_database_url_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="SQLAlchemy URL"):
        KeyDatabase.open(tmp_path / "unused", "not a url")
