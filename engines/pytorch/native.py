"""Build and load the native engine's C kernels (plain C, no torch headers) with the system C compiler.

The sources are C files shipped with the package in `engines/pytorch/csrc/`: a library `name` is `csrc/name.c`
with the headers beside it. A library is compiled once per source (the .c file and every header), flags, compiler
and CPU (`-march=native`: a cache shared between machines must not hand one CPU's build to another), in a second or
two, into `<cache>/kernels/`, and loaded with ctypes (which releases the GIL during calls). Callers get None when
there is no compiler or the build fails, and then use their torch path.

Loading a library runs its code in the server, so only a trusted one is loaded: the kernels folder is created
0700, and a library that is not a regular file owned by the server's user, or that group or others may write, is
rebuilt rather than loaded. When the folder itself is not private (another owner, writable by others), libraries
are built into a private temporary folder instead.

Each library's ctypes signatures are declared once, in a table (`Signatures`) next to the Python that calls it,
and set on the library when it is loaded; tests/engines/pytorch/test_csrc.py checks every table against the C.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("switchyard.engines.pytorch")

# No -ffast-math (gcc < 13 links crtfastmath.o even into shared objects, which sets flush-to-zero process-wide) and
# no implicit FMA contraction (elementwise code must round like torch); kernels use FMA through intrinsics.
# -Wall -Wextra: the sources build without a warning (tested with -Werror on every instruction set they have paths
# for); a warning here does not stop the build, so a newer compiler's new warning does not turn the kernels off.
# seconds one library may take to build (a sanitized gemm.c takes minutes on a busy 2-core box: ASan runs lift it)
BUILD_TIMEOUT: float | None = 300
CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-shared", "-std=gnu11", "-Wall", "-Wextra"]
CSRC = Path(__file__).resolve().parent / "csrc"
_loaded: dict[str, ctypes.CDLL | None] = {}

# A library's exported functions: name -> (restype, argtypes), ctypes types (None: void). Pointers are c_void_p
# (tensors pass data_ptr()), int64_t c_int64, int c_int, float c_float.
Signatures = dict[str, tuple[Any, list[Any]]]


def _cpu_identity() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
        return next((line for line in text.splitlines() if line.startswith("flags")), "")
    except OSError:
        return os.uname().machine


def _sources(name: str, source_dir: Path) -> dict[str, bytes]:
    """The files a library is built from: its `name.c` and every header beside it (any may be included)."""
    files = [source_dir / f"{name}.c", *sorted(source_dir.glob("*.h"))]
    return {f.name: f.read_bytes() for f in files}


def _build(name: str, source_dir: Path, cache_dir: Path) -> Path | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        log.warning("no C compiler found: the native engine uses its slower torch paths")
        return None
    try:
        version = subprocess.run([cc, "--version"], check=False, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    sources = _sources(name, source_dir)
    flags = list(CFLAGS)  # read once: the key and the command take the same flags (tests change CFLAGS at times)
    digest = hashlib.sha256()
    for part in (
        *(f"{file}\0".encode() + text for file, text in sources.items()),
        " ".join(flags).encode(),
        version.encode(),
        _cpu_identity().encode(),
    ):
        digest.update(part + b"\0")
    key = digest.hexdigest()
    folder = _private_folder(cache_dir / "kernels")
    target = folder / f"{name}-{key[:16]}.so"
    if _trusted(target):
        return target
    if os.path.lexists(target):
        log.warning("C kernel %s: %s is not owned by this user or is writable by others; rebuilding it", name, target)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        for file, text in sources.items():  # build exactly the bytes the key was taken over
            (Path(tmp) / file).write_bytes(text)
        out = Path(tmp) / f"{name}.so"
        proc = subprocess.run(
            [cc, *flags, "-o", str(out), str(Path(tmp) / f"{name}.c")],
            check=False,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
        )
        if proc.returncode != 0:
            log.warning("C kernel %s did not build (%s); using the torch path", name, proc.stderr[-500:])
            return None
        if proc.stderr.strip():
            log.info("C kernel %s built with compiler messages: %s", name, proc.stderr[-500:])
        os.chmod(out, 0o700)
        os.replace(out, target)  # atomic: concurrent starts may each build; the last rename wins
    return target


def _owned_and_private(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _trusted(path: Path) -> bool:
    """A library we may load: a regular file (not a link) of this user that group and others cannot write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and _owned_and_private(st)


_fallback_folder: Path | None = None


def _private_folder(folder: Path) -> Path:
    """`folder`, created 0700, if it is this user's own and others cannot write to it (nobody else can swap a
    library in it between the check and the load); otherwise a private temporary folder for this process."""
    global _fallback_folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(folder)
        if stat.S_ISDIR(st.st_mode) and _owned_and_private(st):
            return folder
    except OSError:
        pass
    if _fallback_folder is None:
        _fallback_folder = Path(tempfile.mkdtemp(prefix="switchyard-kernels-"))
    log.warning("the kernel cache %s is not private to this user; building C kernels in %s", folder, _fallback_folder)
    return _fallback_folder


def load_library(
    name: str, cache_dir: Path | None, signatures: Signatures, source_dir: Path = CSRC
) -> ctypes.CDLL | None:
    """The compiled library `source_dir/name.c` (built on first use) with `signatures` set on its functions, or None
    when it cannot be built here."""
    if cache_dir is None:
        return None
    if name not in _loaded:
        lib = None
        try:
            path = _build(name, source_dir, cache_dir)
            lib = ctypes.CDLL(str(path)) if path is not None else None
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("C kernel %s unavailable (%s); using the torch path", name, exc)
        if lib is not None:
            for fn, (restype, argtypes) in signatures.items():
                getattr(lib, fn).restype = restype
                getattr(lib, fn).argtypes = argtypes
        _loaded[name] = lib
    return _loaded[name]


# The helper-thread pool's entry points (csrc/pool.c).
POOL_SIGNATURES: Signatures = {
    "pool_start": (ctypes.c_int, [ctypes.c_int]),
    "pool_width": (None, [ctypes.c_int]),
    "pool_run": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    "pool_stats": (None, [ctypes.c_void_p]),
    "pool_wake": (None, []),
    "pool_rest": (None, []),
}


class HelperThreads:
    """`count` helper threads that join the caller inside the kernels' `*_par` entry points."""

    def __init__(self, count: int, cache_dir: Path | None) -> None:
        """Raises OSError when the pool cannot be built here (no compiler): the caller then runs alone."""
        lib = load_library("pool", cache_dir, POOL_SIGNATURES)
        if lib is None:
            raise OSError("the helper-thread pool did not build")
        lib.pool_start(count)
        self.count = count
        self._width = lib.pool_width
        self._run = ctypes.cast(lib.pool_run, ctypes.c_void_p)
        self._stats = lib.pool_stats
        self._wake, self._rest = lib.pool_wake, lib.pool_rest
        self.enter()  # the thread that builds them may use them (a thread that never entered runs its jobs alone)

    def wake(self) -> None:
        """A step's kernels follow: sleeping helpers start spinning now (call right before the first)."""
        self._wake()

    def rest(self) -> None:
        """The step's kernels are done: helpers sleep until the next job rather than spin (the server's other
        threads need the cores between steps, and spinning burns a container's CPU quota)."""
        self._rest()

    def stats(self) -> dict[str, int]:
        """The pool's hand-off counters since start (process-wide): jobs, jobs that woke a sleeping helper, ns the
        callers waited at the join, ns from posting a job to helpers entering it and how many entries; profiles
        (bench/step_profile.py) take differences."""
        out = (ctypes.c_int64 * 5)()
        self._stats(out)
        return dict(zip(("jobs", "woken", "join_ns", "enter_ns", "entered"), out, strict=True))

    def enter(self) -> None:
        """Let the calling thread's jobs take `count` helpers (the pool is process-wide and only grows: another
        engine may have started more). Call on the step's thread before its kernels: a thread that never did runs
        its jobs alone."""
        self._width(self.count)

    def attach(self, lib: ctypes.CDLL) -> None:
        """Let a kernel library (one that includes csrc/pool_client.h, with `set_pool` in its signatures) run its
        `*_par` jobs on these threads."""
        lib.set_pool(self._run)
