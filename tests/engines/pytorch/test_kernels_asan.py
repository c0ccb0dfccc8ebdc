"""The C kernels under AddressSanitizer (bench/asan_kernels.py): a subset of their tests, one file per kernel
library and the random step inputs, run with every library built `-fsanitize=address` pass without a report; and
the setup does see a read one element past a torch tensor (so a clean run means something). The full set:
`python bench/asan_kernels.py`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.asan_kernels import ASAN_EXIT, ASAN_OPTIONS, FLAGS, SUBSET, asan_runtime, run

pytestmark = pytest.mark.slow
RUNTIME = asan_runtime()
needs_asan = pytest.mark.skipif(RUNTIME is None, reason="the C compiler here cannot build with -fsanitize=address")

OVERREAD = "float read_past(const float *x, long n) { return x[n]; }\n"
PROBE = (
    "import ctypes, sys, torch\n"
    "lib = ctypes.CDLL(sys.argv[1])\n"
    "lib.read_past.restype = ctypes.c_float\n"
    "lib.read_past.argtypes = [ctypes.c_void_p, ctypes.c_long]\n"
    "x = torch.zeros(1000)\n"
    "lib.read_past(x.data_ptr(), 999)\n"
    "print('in bounds', flush=True)\n"
    "lib.read_past(x.data_ptr(), 1000)\n"
)


@needs_asan
def test_asan_sees_a_read_past_a_tensor(tmp_path: Path) -> None:
    cc = os.environ.get("CC") or "cc"
    (tmp_path / "probe.c").write_text(OVERREAD)
    subprocess.run(
        [cc, "-O1", "-shared", "-fPIC", *FLAGS, "-o", str(tmp_path / "probe.so"), str(tmp_path / "probe.c")], check=True
    )
    env = {**os.environ, "LD_PRELOAD": str(RUNTIME), "ASAN_OPTIONS": ASAN_OPTIONS}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "probe.so")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "in bounds" in done.stdout, done.stderr[-3000:]
    assert done.returncode == ASAN_EXIT and "heap-buffer-overflow" in done.stderr, done.stderr[-3000:]


@needs_asan
def test_kernel_tests_pass_under_asan(tmp_path: Path) -> None:
    done = run(SUBSET, tmp_path, ["-m", "not slow", "-x"], timeout=900)
    report = f"{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    assert "ERROR: AddressSanitizer" not in done.stderr, report
    assert done.returncode == 0, report
    assert " passed" in done.stdout, report
