"""The helper-thread pool (engines/pytorch/native.py): a job takes at most its engine's helpers, however many the
process-wide pool has started."""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path

from engines.pytorch.native import POOL_SIGNATURES, HelperThreads, load_library

TASK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _participants(helpers: HelperThreads, lib: ctypes.CDLL) -> int:
    """Threads that ran one job: each stays in it long enough for every helper allowed in to join."""
    seen: set[int] = set()
    guard = threading.Lock()

    def task(_: int | None) -> None:
        with guard:
            seen.add(threading.get_ident())
        time.sleep(0.2)  # releases the GIL: the helpers' calls into Python run meanwhile

    callback = TASK(task)
    helpers.enter()
    lib.pool_run(callback, None)
    return len(seen)


def test_a_job_takes_at_most_its_engines_helpers(tmp_path: Path) -> None:
    wide = HelperThreads(3, tmp_path)  # the pool now runs 3 helpers
    narrow = HelperThreads(1, tmp_path)  # another engine with a budget of 2 threads: the pool keeps its 3
    lib = load_library("pool", tmp_path, POOL_SIGNATURES)  # the library both share (already built and loaded)
    assert lib is not None
    assert max(_participants(narrow, lib) for _ in range(3)) <= 2  # the caller and one helper
    assert max(_participants(wide, lib) for _ in range(3)) > 2  # the left-out helpers come back when wanted
    assert max(_participants(narrow, lib) for _ in range(3)) <= 2
