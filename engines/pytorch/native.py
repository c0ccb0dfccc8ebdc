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
from pathlib import Path

log = logging.getLogger("switchyard.engines.pytorch")

# No -ffast-math (gcc < 13 links crtfastmath.o even into shared objects, which sets flush-to-zero process-wide) and
# no implicit FMA contraction (elementwise code must round like torch); kernels use FMA through intrinsics.
CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-shared", "-std=gnu11"]
_loaded: dict[str, ctypes.CDLL | None] = {}


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
