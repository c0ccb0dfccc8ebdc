"""Build and load the native engine's C kernels (plain C, no torch headers) with the system C compiler.

A library is compiled once per source, flags, compiler and CPU (`-march=native`: a cache shared between machines
must not hand one CPU's build to another), in well under a second, into `<cache>/kernels/`, and loaded with
ctypes (which releases the GIL during calls). Callers get None when there is no compiler or the build fails, and
then use their torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

log = logging.getLogger("switchyard.engines.pytorch")

# No -ffast-math (gcc < 13 links crtfastmath.o even into shared objects, which sets flush-to-zero process-wide) and
# no implicit FMA contraction (elementwise code must round like torch); kernels use FMA through intrinsics.
CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-shared", "-std=gnu11"]
_loaded: dict[str, ctypes.CDLL | None] = {}

# One vectorised exp for every kernel (SiLU in the dense layers, softmax in attention): 8 floats, AVX2 + FMA.
# Sources put it where they write EXP8_AVX2.
EXP8_AVX2 = r"""
/* exp(x) for |x| <= 88: Cody-Waite range reduction and a degree-6 polynomial, within 2 ulp of expf.
   Exact powers of two scale the result, so it is the same whichever kernel calls it. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    /* 2^n in two halves so that n = 128 does not overflow the exponent field */
    __m256i e = _mm256_cvtps_epi32(n);
    __m256i e1 = _mm256_srai_epi32(e, 1), e2 = _mm256_sub_epi32(e, e1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}
"""


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
    target = cache_dir / "kernels" / f"{name}-{key[:16]}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / f"{name}.c"
        src.write_text(source)
        out = Path(tmp) / f"{name}.so"
        proc = subprocess.run(
            [cc, *CFLAGS, "-o", str(out), str(src)], check=False, capture_output=True, text=True, timeout=300
        )
        if proc.returncode != 0:
            log.warning("C kernel %s did not build (%s); using the torch path", name, proc.stderr[-500:])
            return None
        os.replace(out, target)  # atomic: concurrent starts may each build; the last rename wins
    return target


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


class HelperThreads:
    """Threads that join the caller in one C kernel call on large steps (ctypes releases the GIL while C runs),
    blocked on a queue the rest of the time. The kernels hand out work through an atomic counter in the
    arguments, so a thread that gets less CPU simply does less, and the results do not depend on who did what."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._pool = ThreadPoolExecutor(count, thread_name_prefix="switchyard-kernel")

    def run(self, fn: Callable[..., object], *args: object) -> list[object]:
        """`fn(*args)` on the caller and on every helper at once; the return values, the caller's first."""
        futures = [self._pool.submit(fn, *args) for _ in range(self.count)]
        return [fn(*args), *(future.result() for future in futures)]
