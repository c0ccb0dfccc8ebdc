"""engines/gguf_cache.py: keys that follow the file, folders that appear whole, stale entries removed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from transformers import PretrainedConfig

from engines.gguf_cache import cache_entry, cache_key, publish


def test_the_key_follows_the_file(tmp_path: Path) -> None:
    gguf = tmp_path / "model.Q4_0.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    first = cache_key(gguf)
    assert first.startswith("model.Q4_0-") and cache_key(gguf) == first
    stat = gguf.stat()
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert cache_key(gguf) != first


def test_a_published_folder_is_whole_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "model-abc.config"
    publish(target, (PretrainedConfig(hidden_size=8),), "config.json")
    assert (target / "config.json").is_file()
    assert sorted(p.name for p in target.parent.iterdir()) == ["model-abc.config"]


def test_a_concurrent_start_that_won_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "model-abc.config"
    publish(target, (PretrainedConfig(hidden_size=8),), "config.json")
    (target / "kept").write_text("the first start's")
    publish(target, (PretrainedConfig(hidden_size=16),), "config.json")  # the rename fails: target exists, whole
    assert (target / "kept").read_text() == "the first start's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-abc.config"]


def test_a_target_without_the_marker_is_an_error(tmp_path: Path) -> None:
    target = tmp_path / "model-abc.config"
    target.mkdir()
    (target / "stray").write_text("not a cached folder")
    with pytest.raises(OSError):
        publish(target, (PretrainedConfig(hidden_size=8),), "config.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model-abc.config"]


def _entry(folder: Path, gguf: Path, suffix: str = "") -> Path:
    """Make `gguf`'s entry as the loader does: a folder, `.config` beside it and a weights file."""
    entry = cache_entry(folder, gguf, suffix)
    entry.mkdir()
    entry.with_name(f"{entry.name}.config").mkdir()
    entry.with_name(f"{entry.name}.weights-1.safetensors").write_bytes(b"w")
    return entry


def _names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_entries_of_a_removed_or_replaced_file_are_removed(tmp_path: Path) -> None:
    folder, models = tmp_path / "cache", tmp_path / "models"
    models.mkdir()
    kept, removed, replaced = (models / f"{n}.gguf" for n in ("kept", "removed", "replaced"))
    for path in (kept, removed, replaced):
        path.write_bytes(b"GGUF" + bytes(60))
    entries = {path: _entry(folder, path, "-5") for path in (kept, removed, replaced)}
    assert len(_names(folder)) == 12  # three entries of three parts, and their records
    removed.unlink()
    replaced.write_bytes(b"GGUF" + bytes(90))  # a new download under the same name
    new = cache_entry(folder, replaced, "-5")
    assert new != entries[replaced]
    left = _names(folder)
    assert {n for n in left if n.startswith(entries[kept].name)} == {
        f"{entries[kept].name}{extension}" for extension in ("", ".config", ".weights-1.safetensors", ".source")
    }
    assert not any(n.startswith(("removed-", entries[replaced].name)) for n in left)
    assert f"{new.name}.source" in left


def test_the_same_file_under_a_new_key_drops_the_old_entry(tmp_path: Path) -> None:
    folder, gguf = tmp_path / "cache", tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    old = _entry(folder, gguf, "-4")  # made by an older reader version
    again = cache_entry(folder, gguf, "-4")
    assert again == old and old.is_dir()  # the same key is the same entry
    new = cache_entry(folder, gguf, "-5")
    assert _names(folder) == {f"{new.name}.source"}


def test_an_unreadable_record_is_left_alone(tmp_path: Path) -> None:
    folder, gguf = tmp_path / "cache", tmp_path / "model.gguf"
    folder.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(60))
    (folder / "other-0123.source").write_text("not json")
    (folder / "other-0123").mkdir()
    cache_entry(folder, gguf)
    assert {"other-0123", "other-0123.source"} <= _names(folder)
