"""Build and load the native engine's C kernels (plain C, no torch headers) with the system C compiler.

A library is compiled once per source, flags, compiler and CPU (`-march=native`: a cache shared between machines
must not hand one CPU's build to another), in well under a second, into `<cache>/kernels/`, and loaded with
ctypes (which releases the GIL during calls). Callers get None when there is no compiler or the build fails, and
then use their torch path.

Loading a library runs its code in the server, so only a trusted one is loaded: the kernels folder is created
0700, and a library that is not a regular file owned by the server's user, or that group or others may write, is
rebuilt rather than loaded. When the folder itself is not private (another owner, writable by others), libraries
are built into a private temporary folder instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import stat
import string
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger("switchyard.engines.pytorch")

# No -ffast-math (gcc < 13 links crtfastmath.o even into shared objects, which sets flush-to-zero process-wide) and
# no implicit FMA contraction (elementwise code must round like torch); kernels use FMA through intrinsics.
CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-shared", "-std=gnu11"]
_loaded: dict[str, ctypes.CDLL | None] = {}

# One vectorised exp for every kernel (SiLU in the dense layers, softmax in attention), written once for both
# vector widths: exp8 (AVX2 + FMA, 8 floats) and exp16 (AVX-512, 16 floats) do the same operations, so every lane
# gets the same value from either. Sources put them where they write EXP8_AVX2 / EXP16_AVX512.
_EXP_TEMPLATE = string.Template(r"""
/* exp(x) for |x| <= 88: Cody-Waite range reduction and a degree-6 polynomial, within 2 ulp of expf.
   Exact powers of two scale the result, so it is the same whichever kernel calls it. */
static inline ${v} ${name}(${v} x) {
    x = ${mm}min_ps(${mm}max_ps(x, ${mm}set1_ps(-87.0f)), ${mm}set1_ps(88.0f));
    ${v} n = ${round}(${mm}mul_ps(x, ${mm}set1_ps(1.44269504088896341f)),
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    ${v} r = ${mm}fnmadd_ps(n, ${mm}set1_ps(0.693359375f), x);
    r = ${mm}fnmadd_ps(n, ${mm}set1_ps(-2.12194440e-4f), r);
    ${v} p = ${mm}set1_ps(1.9875691500e-4f);
    p = ${mm}fmadd_ps(p, r, ${mm}set1_ps(1.3981999507e-3f));
    p = ${mm}fmadd_ps(p, r, ${mm}set1_ps(8.3334519073e-3f));
    p = ${mm}fmadd_ps(p, r, ${mm}set1_ps(4.1665795894e-2f));
    p = ${mm}fmadd_ps(p, r, ${mm}set1_ps(1.6666665459e-1f));
    p = ${mm}fmadd_ps(p, r, ${mm}set1_ps(5.0000001201e-1f));
    p = ${mm}add_ps(${mm}fmadd_ps(p, ${mm}mul_ps(r, r), r), ${mm}set1_ps(1.0f));
    /* 2^n in two halves so that n = 128 does not overflow the exponent field */
    ${vi} e = ${mm}cvtps_epi32(n);
    ${vi} e1 = ${mm}srai_epi32(e, 1), e2 = ${mm}sub_epi32(e, e1);
    ${v} s1 = ${mm}castsi${bits}_ps(${mm}slli_epi32(${mm}add_epi32(e1, ${mm}set1_epi32(127)), 23));
    ${v} s2 = ${mm}castsi${bits}_ps(${mm}slli_epi32(${mm}add_epi32(e2, ${mm}set1_epi32(127)), 23));
    return ${mm}mul_ps(${mm}mul_ps(p, s1), s2);
}
""")


def _exp(bits: int) -> str:
    """exp8 (256 bits, AVX2 + FMA) or exp16 (512 bits, AVX-512) from the one template."""
    return _EXP_TEMPLATE.substitute(name=f"exp{bits // 32}", v=f"__m{bits}", vi=f"__m{bits}i", mm=f"_mm{bits}_",
                                    bits=bits, round="_mm256_round_ps" if bits == 256 else "_mm512_roundscale_ps")


EXP8_AVX2 = _exp(256)
EXP16_AVX512 = _exp(512)


def _cpu_identity() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
        return next((line for line in text.splitlines() if line.startswith("flags")), "")
    except OSError:
        return os.uname().machine


def _build(name: str, source: str, cache_dir: Path) -> Path | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        log.warning("no C compiler found: the native engine uses its slower torch paths")
        return None
    try:
        version = subprocess.run([cc, "--version"], check=False, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    key = hashlib.sha256("\0".join([source, " ".join(CFLAGS), version, _cpu_identity()]).encode()).hexdigest()
    folder = _private_folder(cache_dir / "kernels")
    target = folder / f"{name}-{key[:16]}.so"
    if _trusted(target):
        return target
    if os.path.lexists(target):
        log.warning("C kernel %s: %s is not owned by this user or is writable by others; rebuilding it", name, target)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        src = Path(tmp) / f"{name}.c"
        src.write_text(source)
        out = Path(tmp) / f"{name}.so"
        proc = subprocess.run(
            [cc, *CFLAGS, "-o", str(out), str(src)], check=False, capture_output=True, text=True, timeout=300
        )
        if proc.returncode != 0:
            log.warning("C kernel %s did not build (%s); using the torch path", name, proc.stderr[-500:])
            return None
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


def load_library(name: str, source: str, cache_dir: Path | None) -> ctypes.CDLL | None:
    """The compiled library for `source` (built on first use), or None when it cannot be built here."""
    if cache_dir is None:
        return None
    if name not in _loaded:
        lib = None
        try:
            path = _build(name, source, cache_dir)
            lib = ctypes.CDLL(str(path)) if path is not None else None
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("C kernel %s unavailable (%s); using the torch path", name, exc)
        _loaded[name] = lib
    return _loaded[name]


# The helper-thread pool (its own library, so every kernel library shares one set of threads). Helpers are plain
# pthreads that never touch Python: after a job they spin briefly (the next kernel of a step follows within
# microseconds), then sleep on a futex. A job is `fn(arg)` run by the caller and by every helper that joins
# before the caller is done; kernels hand out work through an atomic counter in `arg`, so a helper that joins
# late (or not at all, when its core is busy) simply does less, and the results do not depend on who did what.
_POOL_SOURCE = r"""
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <immintrin.h>

#define CLOSED (1 << 30)
#define SPINS 4000
typedef void (*task_fn)(void*);
static unsigned gen;         /* bumped for every job */
static int state;            /* helpers inside the current job, | CLOSED once the caller is done */
static int sleepers, started;
static task_fn job_fn;
static void* job_arg;
static int job_helpers;                /* helpers 0 .. job_helpers - 1 take part in the current job */
static __thread int width = INT_MAX;   /* helpers the calling thread's jobs may take (pool_width) */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void* helper(void* arg) {
    int index = (int)(intptr_t)arg;
    unsigned seen = __atomic_load_n(&gen, __ATOMIC_SEQ_CST);
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = __atomic_load_n(&gen, __ATOMIC_SEQ_CST)) == seen) {
            if (spins++ < SPINS) { _mm_pause(); continue; }
            __atomic_add_fetch(&sleepers, 1, __ATOMIC_SEQ_CST);
            syscall(SYS_futex, &gen, FUTEX_WAIT_PRIVATE, seen, 0, 0, 0);
            __atomic_sub_fetch(&sleepers, 1, __ATOMIC_SEQ_CST);
            spins = 0;
        }
        seen = g;
        int w;
        if (index >= (w = __atomic_load_n(&job_helpers, __ATOMIC_SEQ_CST))) {
            /* left out of this job (its engine's budget is smaller than the pool): sleep, without spinning or
               counting as a sleeper that every job must wake, until a job wants more helpers */
            while (index >= (w = __atomic_load_n(&job_helpers, __ATOMIC_SEQ_CST)))
                syscall(SYS_futex, &job_helpers, FUTEX_WAIT_PRIVATE, w, 0, 0, 0);
            continue;
        }
        int s = __atomic_load_n(&state, __ATOMIC_SEQ_CST);
        while (!(s & CLOSED))
            if (__atomic_compare_exchange_n(&state, &s, s + 1, 1, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
                job_fn(job_arg);
                __atomic_sub_fetch(&state, 1, __ATOMIC_SEQ_CST);
                break;
            }
    }
    return 0;
}

/* Start helpers until `count` run (process-wide); returns how many run. */
int pool_start(int count) {
    pthread_mutex_lock(&lock);
    while (started < count) {
        pthread_t t;
        if (pthread_create(&t, 0, helper, (void*)(intptr_t)started) != 0) break;
        pthread_detach(t);
        started++;
    }
    pthread_mutex_unlock(&lock);
    return started;
}

/* At most `helpers` helpers join the jobs this thread runs from now on (an engine whose budget is smaller than
   the pool, which only grows, uses no more than its budget). */
void pool_width(int helpers) { width = helpers; }

/* fn(arg) on the caller and on the helpers; returns when all of them are out of it. One job at a time: a
   second caller (another engine's step) runs its job alone rather than wait. */
void pool_run(task_fn fn, void* arg) {
    if (width <= 0 || pthread_mutex_trylock(&lock) != 0) { fn(arg); return; }
    job_fn = fn;
    job_arg = arg;
    int before = __atomic_exchange_n(&job_helpers, width, __ATOMIC_SEQ_CST);
    __atomic_store_n(&state, 0, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&gen, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&sleepers, __ATOMIC_SEQ_CST) > 0) syscall(SYS_futex, &gen, FUTEX_WAKE_PRIVATE, INT_MAX, 0, 0, 0);
    if (width > before) syscall(SYS_futex, &job_helpers, FUTEX_WAKE_PRIVATE, INT_MAX, 0, 0, 0);
    fn(arg);
    __atomic_fetch_or(&state, CLOSED, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&state, __ATOMIC_SEQ_CST) & ~CLOSED) _mm_pause();
    pthread_mutex_unlock(&lock);
}
"""

# Put in a kernel library's source where it writes POOL_CLIENT: `POOL_RUN(fn, arg)` runs a job on the pool once
# Python has handed the library the pool (`set_pool`), else on the caller alone.
POOL_CLIENT = r"""
typedef void (*pool_task_fn)(void*);
static void (*pool_run_fn)(pool_task_fn, void*);
void set_pool(void* run) { pool_run_fn = (void (*)(pool_task_fn, void*))run; }
#define POOL_RUN(fn, arg) (pool_run_fn ? pool_run_fn((fn), (arg)) : (fn)(arg))
"""


class HelperThreads:
    """`count` helper threads that join the caller inside the kernels' `*_par` entry points."""

    def __init__(self, count: int, cache_dir: Path | None) -> None:
        """Raises OSError when the pool cannot be built here (no compiler): the caller then runs alone."""
        lib = load_library("pool", _POOL_SOURCE, cache_dir)
        if lib is None:
            raise OSError("the helper-thread pool did not build")
        lib.pool_start.argtypes = [ctypes.c_int]
        lib.pool_start(count)
        lib.pool_width.argtypes = [ctypes.c_int]
        lib.pool_width.restype = None
        self.count = count
        self._width = lib.pool_width
        self._run = ctypes.cast(lib.pool_run, ctypes.c_void_p)

    def enter(self) -> None:
        """Let the calling thread's jobs take `count` helpers (the pool is process-wide and only grows: another
        engine may have started more). Call on the step's thread before its kernels."""
        self._width(self.count)

    def attach(self, lib: ctypes.CDLL) -> None:
        """Let a kernel library (built with POOL_CLIENT) run its `*_par` jobs on these threads."""
        lib.set_pool.argtypes = [ctypes.c_void_p]
        lib.set_pool.restype = None
        lib.set_pool(self._run)
