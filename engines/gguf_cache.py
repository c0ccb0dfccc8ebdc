"""Cached folders made from a GGUF file (an HF conversion, a config, a tokenizer): their key and their publication.

Reading a GGUF file's config, tokenizer or weights through transformers takes seconds to minutes, so what a start
reads is saved as an HF folder keyed by the file's identity, and later starts load that. Both the native engine's
loader and the remote engines' tokenizer do this, in one shared way.

An entry is only as good as its file: one whose file was deleted, replaced (a new download: another size or mtime)
or is now read under another key (a new transformers, a new reader version) is never used again, and the entries of
a large model are gigabytes. So each entry records its file (`<key>.source`), and every use of the cache folder
removes the entries whose file no longer matches what they were made of.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("switchyard.engines")
SOURCE_SUFFIX = ".source"  # `<key>.source`: the file an entry was made of, as JSON (path, size, mtime_ns)


def cache_key(gguf: Path) -> str:
    """A name for what is cached from `gguf`: it changes when the file (name, size, mtime) or transformers does."""
    import transformers

    stat = gguf.stat()
    ident = f"{gguf.name}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    return f"{gguf.stem}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def publish(target: Path, parts: tuple[Any, ...], marker: str) -> None:
    """Save each of `parts` (`save_pretrained`) into a fresh folder beside `target`, then rename it to `target`: a
    start never sees half a folder, and of two concurrent starts the second finds the first's (`marker`: a file
    every complete folder has)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        for part in parts:
            part.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / marker).exists():  # a concurrent start may have won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cache_entry(folder: Path, gguf: Path, suffix: str = "") -> Path:
    """The path of `gguf`'s entry in the cache `folder` (its key plus `suffix`; the caller adds its own extensions),
    recorded as made of `gguf`, after removing the folder's stale entries (see the module's docstring)."""
    key = cache_key(gguf) + suffix
    stat, path = gguf.stat(), str(gguf.absolute())  # not resolved: two links to one file are two entries
    made_of = {"path": path, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    _remove_stale(folder, key, path)
    record = folder / f"{key}{SOURCE_SUFFIX}"
    if not record.exists():
        with contextlib.suppress(OSError):  # a read-only or full cache disk: the entry works unrecorded
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{record.name}-", dir=folder)
            with os.fdopen(fd, "w") as out:
                json.dump(made_of, out)
            os.replace(tmp, record)
    return folder / key


def _remove_stale(folder: Path, current: str, current_path: str) -> None:
    """Remove the entries of `folder` whose file is gone or changed, or is `current_path` under another key."""
    for record in folder.glob(f"*{SOURCE_SUFFIX}"):
        key = record.name.removesuffix(SOURCE_SUFFIX)
        if key == current:
            continue
        try:
            made_of = json.loads(record.read_text())
            stat = Path(made_of["path"]).stat()
            stale = made_of["path"] == current_path or (stat.st_size, stat.st_mtime_ns) != (
                made_of["size"],
                made_of["mtime_ns"],
            )
        except FileNotFoundError:
            stale = True  # the file is gone (or another process removed the record first)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable: leave it to a later start rather than guess
        if stale:
            _remove_entry(folder, key)


def _remove_entry(folder: Path, key: str) -> None:
    """Remove `key` and every `key.<extension>` beside it (the record last, so a failed removal is retried)."""
    for path in [folder / key, *folder.glob(f"{glob.escape(key)}.*")]:
        if path.name.endswith(SOURCE_SUFFIX):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    (folder / f"{key}{SOURCE_SUFFIX}").unlink(missing_ok=True)
    log.info("removed the stale cache entry %s (its GGUF file was removed or replaced)", key)
