"""The helper-thread pool (engines/pytorch/native.py): a job takes at most its engine's helpers, however many the
process-wide pool has started."""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path

from engines.pytorch.native import POOL_SIGNATURES, HelperThreads, load_library

TASK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _participants(helpers: HelperThreads | None, lib: ctypes.CDLL, enough: int | None = None) -> int:
    """Threads that ran one job (posted after `helpers.enter()`; None: with the thread's width as it is): each stays
    in it long enough for every helper allowed in to join (0.2 s), or until `enough` threads have joined (a test
    that needs at least that many need not wait out the rest)."""
    seen: set[int] = set()
    joined = threading.Condition()

    def task(_: int | None) -> None:
        with joined:
            seen.add(threading.get_ident())
            joined.notify_all()
            # waiting releases the GIL: the helpers' calls into Python run meanwhile
            joined.wait_for(lambda: enough is not None and len(seen) >= enough, timeout=0.2)

    callback = TASK(task)
    if helpers is not None:
        helpers.enter()
    lib.pool_run(callback, None)
    return len(seen)


def test_a_job_takes_at_most_its_engines_helpers(tmp_path: Path) -> None:
    wide = HelperThreads(3, tmp_path)  # the pool now runs 3 helpers
    narrow = HelperThreads(1, tmp_path)  # another engine with a budget of 2 threads: the pool keeps its 3
    lib = load_library("pool", tmp_path, POOL_SIGNATURES)  # the library both share (already built and loaded)
    assert lib is not None
    assert max(_participants(narrow, lib) for _ in range(3)) <= 2  # the caller and one helper
    assert max(_participants(wide, lib, enough=3) for _ in range(3)) > 2  # the left-out helpers come back when wanted
    assert max(_participants(narrow, lib) for _ in range(3)) <= 2


def test_a_thread_that_never_set_its_width_runs_its_jobs_alone(tmp_path: Path) -> None:
    helpers = HelperThreads(3, tmp_path)
    lib = load_library("pool", tmp_path, POOL_SIGNATURES)
    assert lib is not None
    counts: list[int] = []

    def stranger() -> None:  # not an engine's step thread: it never called enter()
        counts.extend(_participants(None, lib) for _ in range(3))

    thread = threading.Thread(target=stranger)
    thread.start()
    thread.join()
    assert counts == [1, 1, 1]
    assert max(_participants(helpers, lib, enough=2) for _ in range(3)) > 1  # the engine's thread gets its helpers


def test_a_narrow_job_never_takes_helpers_left_over_from_a_wide_one(tmp_path: Path) -> None:
    """One engine posts wide jobs back to back (a C no-op, so they close within microseconds) while another runs
    jobs of one helper: a helper that checked its index against a wide job must not slip into the narrow job
    posted right after it (the CAS that lets it in carries the job's number)."""
    wide, narrow = HelperThreads(3, tmp_path), HelperThreads(1, tmp_path)
    lib = load_library("pool", tmp_path, POOL_SIGNATURES)
    assert lib is not None
    noop = ctypes.cast(ctypes.CDLL(None).getpid, ctypes.c_void_p).value
    stop = threading.Event()

    def wide_engine() -> None:
        wide.enter()
        while not stop.is_set():
            for _ in range(1000):
                lib.pool_run(noop, None)

    seen: list[int] = []
    guard = threading.Lock()

    def task(_: int | None) -> None:
        with guard:
            seen.append(threading.get_ident())
        time.sleep(0.0005)

    callback = TASK(task)
    thread = threading.Thread(target=wide_engine)
    thread.start()
    most = 0
    try:
        narrow.enter()
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            seen.clear()
            lib.pool_run(callback, None)
            most = max(most, len(set(seen)))
    finally:
        stop.set()
        thread.join()
    assert most <= 2  # the caller and one helper
