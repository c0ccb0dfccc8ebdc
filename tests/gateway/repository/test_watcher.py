"""Poll mode: the watcher notices new, changed and removed model folders and the registry applies them."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.errors import ModelNotFoundError
from gateway.repository.layout import folder_fingerprint
from gateway.repository.model_control import ModelControl
from gateway.repository.watcher import RepositoryWatcher, scan_fingerprints
from tests.gateway.repository.tiny_models import set_tag, write_tagger, x_input


def test_fingerprint_follows_content_and_ignores_noise(tmp_path: Path) -> None:
    folder = write_tagger(tmp_path, "tagger", tag="a")
    first = folder_fingerprint(folder)
    (folder / "1" / "__pycache__").mkdir()
    (folder / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"x")  # the python backend's import
    (folder / ".config.yaml.swp").write_text("editor")
    (folder / "README.txt.pyc").write_bytes(b"x")
    assert folder_fingerprint(folder) == first
    config = folder / "config.yaml"
    stat = config.stat()
    config.write_text(config.read_text().replace('tag: "a"', 'tag: "b"'))  # same size, same mtime restored
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert folder_fingerprint(folder) != first
    second = folder_fingerprint(folder)
    (folder / "2").mkdir()
    (folder / "2" / "weights.bin").write_bytes(b"0" * 10)
    assert folder_fingerprint(folder) != second


def test_scan_lists_model_folders_only(tmp_path: Path) -> None:
    write_tagger(tmp_path, "tagger")
    (tmp_path / "no_config" / "1").mkdir(parents=True)
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "file.txt").write_text("x")
    twice = write_tagger(tmp_path, "twice")
    (twice / "config.pbtxt").write_text('backend: "python"')  # two config files: refused, files not read
    outside = write_tagger(tmp_path.parent / f"{tmp_path.name}_outside", "secret")
    (tmp_path / "escape").symlink_to(outside, target_is_directory=True)
    found = scan_fingerprints(tmp_path)
    assert sorted(found) == ["escape", "tagger", "twice"]
    assert found["twice"].startswith("refused:") and found["escape"].startswith("refused:")
    assert not found["tagger"].startswith("refused:")


async def tag_of(registry: ModelControl, name: str = "tagger") -> str:
    _, outputs = await registry.models.get(name).tensor.infer([x_input()])
    return next(o for o in outputs if o.name == "TAG").array[0, 0].decode()


@pytest.fixture
async def polled(tmp_path: Path) -> AsyncIterator[tuple[ModelControl, RepositoryWatcher]]:
    repo = tmp_path / "repo"
    write_tagger(repo, "tagger", tag="a")
    registry = ModelControl(repo, control_mode="poll", drain_timeout_s=5)
    registry.prepare()
    for model in registry.load_all():
        await model.start()
    yield registry, RepositoryWatcher(registry, 60)  # polled by hand below
    await registry.close()
    for model in registry.models.all_models():
        await model.stop()


async def test_nothing_changes_nothing(polled) -> None:
    registry, watcher = polled
    before = registry.models.get("tagger")
    for _ in range(3):
        assert await watcher.poll() == ({}, [])
    assert registry.models.get("tagger") is before


async def test_changed_config_reloads_after_it_settles(polled) -> None:
    registry, watcher = polled
    old = registry.models.get("tagger")
    set_tag(registry.root / "tagger", "b")
    assert await watcher.poll() == ({}, [])  # first sight: maybe still being written
    changed, removed = await watcher.poll()  # the same twice: apply
    assert list(changed) == ["tagger"] and removed == []
    assert registry.models.get("tagger") is not old and await tag_of(registry) == "v1:b"
    assert await watcher.poll() == ({}, [])  # applied once


async def test_changed_model_file_reloads(polled) -> None:
    registry, watcher = polled
    write_tagger(registry.root, "tagger", tag="a", code_version="v2-longer", config=False)
    await watcher.poll()
    await watcher.poll()
    assert await tag_of(registry) == "v2-longer:a"


async def test_broken_config_keeps_the_old_copy_then_recovers(polled) -> None:
    registry, watcher = polled
    old = registry.models.get("tagger")
    (registry.root / "tagger" / "config.yaml").write_text("backend: python\nmax_batch_size: 8\nbogus_field: 1\n")
    await watcher.poll()
    await watcher.poll()
    assert registry.models.get("tagger") is old and await tag_of(registry) == "v1:a"
    [row] = [r for r in registry.states.index() if r["name"] == "tagger"]
    assert row["state"] == "READY" and "reload failed" in row["reason"] and "bogus_field" in row["reason"]
    assert await watcher.poll() == ({}, [])  # not retried (nor logged) every poll while the files stay the same
    set_tag(registry.root / "tagger", "fixed")
    await watcher.poll()
    await watcher.poll()
    assert await tag_of(registry) == "v1:fixed"
    assert [r["reason"] for r in registry.states.index() if r["name"] == "tagger"] == [""]


async def test_new_and_removed_folders(polled) -> None:
    registry, watcher = polled
    write_tagger(registry.root, "fresh", tag="new")
    (registry.root / "broken" / "1").mkdir(parents=True)
    (registry.root / "broken" / "config.yaml").write_text("backend: nope\n")
    await watcher.poll()
    changed, _ = await watcher.poll()
    assert sorted(changed) == ["broken", "fresh"]
    assert await tag_of(registry, "fresh") == "v1:new"
    [row] = [r for r in registry.states.index() if r["name"] == "broken"]
    assert row["state"] == "UNAVAILABLE" and "backend" in row["reason"]
    with pytest.raises(ModelNotFoundError):
        registry.models.get("broken")
    old = registry.models.get("tagger")
    shutil.rmtree(registry.root / "tagger")
    assert await watcher.poll() == ({}, [])
    _, removed = await watcher.poll()
    assert removed == ["tagger"]
    with pytest.raises(ModelNotFoundError):
        registry.models.get("tagger")
    await asyncio.wait_for(asyncio.gather(*registry.retiring.tasks), 5)
    assert all(not e.batcher._loop_task or e.batcher._loop_task.done() for e in old.tensor.versions.values())
    assert "tagger" not in registry.fingerprints()


async def test_a_missing_repository_unloads_nothing(polled) -> None:
    registry, watcher = polled
    moved = registry.root.with_name("moved")
    registry.root.rename(moved)
    try:
        with pytest.raises(Exception, match="not a directory"):
            await watcher.poll()
        assert registry.models.get("tagger")
    finally:
        moved.rename(registry.root)


async def test_background_polling(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_tagger(repo, "tagger", tag="a")
    registry = ModelControl(repo, control_mode="poll")
    registry.prepare()
    for model in registry.load_all():
        await model.start()
    registry.start_polling(0.05)
    try:
        set_tag(repo / "tagger", "b")
        for _ in range(100):
            await asyncio.sleep(0.05)
            if await tag_of(registry) == "v1:b":
                break
        assert await tag_of(registry) == "v1:b"
    finally:
        await registry.close()
        for model in registry.models.all_models():
            await model.stop()
    assert registry._watcher is None


def test_interval_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        RepositoryWatcher(ModelControl(tmp_path), 0)
