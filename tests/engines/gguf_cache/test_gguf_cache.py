"""engines/gguf_cache.py: keys that follow the file, folders that appear whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from transformers import PretrainedConfig

from engines.gguf_cache import cache_key, publish


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
