"""A GGUF model's packed panels (block_panels.py) saved beside its cached blocks, so that a start after the first
reads them instead of packing them again.

Why: packing runs in torch ops over every weight and is most of a start (about 20 of the 27 s Llama-3.2-1B's 766 MiB
file takes to get ready, over a minute for an 8B), where llama-server is ready in 1-10 s. And packing reads the
cached blocks' file pages while it writes the panels, so loading peaks above what the engine then holds. A start
that finds the panels saved reads each weight's panels from the file straight into its own huge-page buffer
(host_memory.zeros): the time of a file read, and no page of the cached blocks is touched.

A weight is found by its blocks' `source` (the module paths they were read as, gguf_blocks.py) and its panel count;
blocks without a source (rows taken out of a weight) are packed every time. Panels depend only on the blocks' bytes
and on block_panels.LAYOUT (part of the file's name, loader.py), and the file belongs to one GGUF file's cache entry
(gguf_cache.py removes it with the entry), so a saved panel is the one packing would make. The file is one piece
(a header with the index, then the panels) written under a temporary name and renamed into place once the model is
built: a start reads all of it or none. A start that packs any weight the file lacks (a crash before the rename, a
file cached by an older version) writes it again, whole.

Packers are built deep inside a family's layers (models/, layers/), so the cache of the engine being built is
found through `active()`, set by `saved_panels` around the build, rather than passed through every constructor.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import struct
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from engines.pytorch import host_memory

log = logging.getLogger("switchyard.engines.pytorch")

MAGIC = b"SWPANEL1"  # then the index's length (8 bytes, little-endian), the index (JSON), the panels
ALIGN = 4096  # each weight's panels start on a page of the file
_active: contextvars.ContextVar[PanelCache | None] = contextvars.ContextVar("panel_cache", default=None)


def active() -> PanelCache | None:
    """The cache of the model being built (`saved_panels`), or None."""
    return _active.get()


def key(sources: Sequence[str | None], panels: int) -> str | None:
    """The name of the panels of blocks read as `sources` (several: their panels in turn), `panels` of them; None
    where some part has no source."""
    if any(s is None for s in sources):
        return None
    return f"{'|'.join(s for s in sources if s is not None)}#{panels}"


class PanelCache:
    """The panels saved at `path` (none where the file is absent or unreadable) and those packed in this build."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._saved: dict[str, tuple[int, int, int]] = {}  # key: (offset, rows, bytes a row)
        self._file = None
        self._held: dict[str, torch.Tensor] = {}  # every weight's panels in this build, read or packed
        try:
            self._file = path.open("rb", buffering=0)
            self._saved = self._read_index(self._file)
        except (OSError, ValueError, KeyError, TypeError, struct.error):
            self.close()
        self.packed = 0  # weights packed in this build (none: the file already had them all)

    def _read_index(self, file) -> dict[str, tuple[int, int, int]]:
        head = file.read(16)
        if head[:8] != MAGIC:
            return {}
        (length,) = struct.unpack("<Q", head[8:])
        index = json.loads(file.read(length))
        start, size = _data_start(length), os.fstat(file.fileno()).st_size
        saved = {k: (start + int(o), int(r), int(c)) for k, (o, r, c) in index.items()}
        if any(o + r * c > size for o, r, c in saved.values()):
            return {}  # a truncated file
        return saved

    def get(self, name: str, rows: int) -> torch.Tensor | None:
        """The saved panels `name` ([rows, bytes a panel] uint8, in host memory), or None where the file lacks
        them."""
        found = self._saved.get(name)
        if found is None or found[1] != rows or self._file is None:
            return None
        offset, rows, cols = found
        out = host_memory.zeros((rows, cols), torch.uint8)
        view, done = memoryview(out.numpy()).cast("B"), 0
        while done < len(view):
            n = os.preadv(self._file.fileno(), [view[done:]], offset + done)
            if n <= 0:  # the file shrank under us: pack instead
                return None
            done += n
        self._held[name] = out
        return out

    def put(self, name: str, panels: torch.Tensor) -> None:
        """Record the panels packed for `name` (saved by `save`)."""
        self._held[name] = panels
        self.packed += 1

    def save(self) -> None:
        """Write every weight's panels of this build to the file, where some were packed (the file lacked them).
        A full or read-only disk leaves the file as it was: the next start packs again."""
        if not self.packed:
            return
        index, offset = {}, 0  # offsets from the first page after the index
        for name, t in self._held.items():
            index[name] = (offset, t.shape[0], t.shape[1])
            offset += -(-t.numel() // ALIGN) * ALIGN
        body = json.dumps(index).encode()
        start = _data_start(len(body))
        tmp = None
        try:  # a name of its own: two engines of one process (instances of a model) may save at once
            fd, made = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            tmp = Path(made)
            with os.fdopen(fd, "wb") as out:
                out.write(MAGIC + struct.pack("<Q", len(body)) + body)
                for name, t in self._held.items():
                    out.seek(start + index[name][0])
                    out.write(memoryview(t.contiguous().numpy()).cast("B"))
            tmp.replace(self.path)
        except OSError as exc:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            log.warning("could not save the packed weights to %s (%s); the next start packs them again", self.path, exc)
            return
        log.info("saved the packed panels of %d weights to %s", len(index), self.path)

    def close(self) -> None:
        """Close the saved file and drop this build's references (the engine holds the panels it uses)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._held.clear()


def _data_start(index_bytes: int) -> int:
    """Where the panels start in a file whose index takes `index_bytes`: the first page after it."""
    return -(-(16 + index_bytes) // ALIGN) * ALIGN


@contextlib.contextmanager
def saved_panels(path: Path | None) -> Iterator[PanelCache | None]:
    """Within: packers read and record panels through the cache at `path` (None: no cache). On leaving without an
    error, the panels packed are saved; the held references are dropped either way."""
    cache = PanelCache(path) if path is not None else None
    token = _active.set(cache)
    try:
        yield cache
        if cache is not None:
            cache.save()
    finally:
        _active.reset(token)
        if cache is not None:
            cache.close()
