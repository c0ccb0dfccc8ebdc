"""Cached folders made from a GGUF file (an HF conversion, a config, a tokenizer): their key and their publication.

Reading a GGUF file's config, tokenizer or weights through transformers takes seconds to minutes, so what a start
reads is saved as an HF folder keyed by the file's identity, and later starts load that. Both the native engine's
loader and the remote engines' tokenizer do this, in one shared way.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any


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
