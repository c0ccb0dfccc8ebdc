"""The C kernel cache: its folder is private, and a library someone else could have written is never loaded."""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from engines.pytorch import native

pytestmark = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler")

GOOD = "int answer(void) { return 42; }\n"
EVIL = "int answer(void) { return 666; }\n"


def _load(name: str, cache: Path) -> int:
    native._loaded.pop(name, None)
    sources = cache / "src"
    sources.mkdir(exist_ok=True)
    (sources / f"{name}.c").write_text(GOOD)
    lib = native.load_library(name, cache, {"answer": (ctypes.c_int, [])}, source_dir=sources)
    assert lib is not None
    return lib.answer()


def _plant(cache: Path, name: str) -> Path:
    """Overwrite the cached library for GOOD with one built from EVIL, as an intruder would."""
    [target] = (cache / "kernels").glob(f"{name}-*.so")
    evil_src = cache / "evil.c"
    evil_src.write_text(EVIL)
    subprocess.run([shutil.which("cc") or "gcc", "-shared", "-fPIC", "-o", str(target), str(evil_src)], check=True)
    return target


def test_the_kernel_folder_is_created_private(tmp_path: Path) -> None:
    assert _load("trust_probe_a", tmp_path) == 42
    assert stat.S_IMODE(os.stat(tmp_path / "kernels").st_mode) == 0o700
    [lib] = (tmp_path / "kernels").glob("trust_probe_a-*.so")
    assert not os.stat(lib).st_mode & 0o022


def test_a_library_others_may_write_is_rebuilt_not_loaded(tmp_path: Path) -> None:
    assert _load("trust_probe_b", tmp_path) == 42
    target = _plant(tmp_path, "trust_probe_b")
    os.chmod(target, 0o777)  # group- and world-writable
    assert _load("trust_probe_b", tmp_path) == 42
    assert not os.stat(target).st_mode & 0o022


def test_a_library_of_another_user_is_rebuilt_not_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _load("trust_probe_c", tmp_path) == 42
    target = _plant(tmp_path, "trust_probe_c")
    os.chmod(target, 0o755)
    if os.geteuid() == 0:
        os.chown(target, 12345, -1)
    else:  # cannot give a file away: pretend the server runs as someone else for the file check
        real = native._owned_and_private
        monkeypatch.setattr(native, "_owned_and_private", lambda st: real(st) and stat.S_ISDIR(st.st_mode))
    assert _load("trust_probe_c", tmp_path) == 42
    assert os.lstat(target).st_uid == os.geteuid()


def test_a_folder_others_may_write_is_not_used(tmp_path: Path) -> None:
    assert _load("trust_probe_d", tmp_path) == 42
    _plant(tmp_path, "trust_probe_d")
    os.chmod(tmp_path / "kernels", 0o777)
    assert _load("trust_probe_d", tmp_path) == 42  # built in a private folder of its own instead


def test_a_full_cache_disk_leaves_the_torch_path_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(cache)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here (needs root)")
    try:
        (cache / "kernels").mkdir(mode=0o700)
        with (cache / "filler").open("wb", buffering=0) as f:  # the disk is full
            try:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
            except OSError:
                pass
        sources = tmp_path / "src"
        sources.mkdir()
        (sources / "full_disk_probe.c").write_text(GOOD)
        native._loaded.pop("full_disk_probe", None)
        lib = native.load_library("full_disk_probe", cache, {"answer": (ctypes.c_int, [])}, source_dir=sources)
        assert lib is None  # its callers run their torch path
        assert "No space left on device" in caplog.text and "torch path" in caplog.text
    finally:
        native._loaded.pop("full_disk_probe", None)
        subprocess.run(["umount", "-l", str(cache)], capture_output=True, check=False)
