"""Which server runs the batches of a files folder: the one holding its lock.

Two servers pointed at one `--files-dir` would both resume its unfinished batches and run their lines twice. The
first server to take the folder's lock (an advisory `flock`, which the kernel releases when the process ends, even
killed) runs its batches; another one still serves the folder's files and batches to read, and refuses to create
or cancel batches (503) until the lock is free.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class FolderLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """Take the lock if it is free (never waits); whether this process holds it."""
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None
