"""The native engine's C kernels under AddressSanitizer: their tests run with every kernel library built with
`-fsanitize=address -fno-omit-frame-pointer` (and the sanitizer's runtime preloaded into Python, which is not built
with it), so a read or write past a buffer, a use after free or a stack overflow in the C stops the run with
ASan's report instead of passing unseen.

    python bench/asan_kernels.py            # every kernel test, the forced-path builds (slow) too
    python bench/asan_kernels.py --subset   # the CI subset (tests/engines/pytorch/test_kernels_asan.py)

Exit status: pytest's (0 when every test passed under ASan), 86 when ASan reported an error, 77 when the compiler
cannot build with -fsanitize=address here. The kernels are built into a fresh cache folder (`--cache`), as the
server builds them (engines/pytorch/native.py), with the flags appended to its `CFLAGS`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ["-fsanitize=address", "-fno-omit-frame-pointer"]
ASAN_EXIT = 86
UNSUPPORTED = 77
# Python and torch are not built with ASan: leaks are theirs (not checked); an error stops the run with ASAN_EXIT
ASAN_OPTIONS = f"detect_leaks=0:halt_on_error=1:exitcode={ASAN_EXIT}:detect_stack_use_after_return=0"
KERNEL_TESTS = "tests/engines/pytorch"
SUBSET = [  # one test file per kernel library: argmax, paged attention, the GEMM's block types, step replay, moe, lora
    f"{KERNEL_TESTS}/test_argmax.py",
    f"{KERNEL_TESTS}/test_lora_kernel.py",
    f"{KERNEL_TESTS}/test_paged_attention.py",
    f"{KERNEL_TESTS}/test_gguf_blocks_kernels.py",
    f"{KERNEL_TESTS}/test_kernel_steps_fuzz.py",
]
FULL = [
    *SUBSET,
    f"{KERNEL_TESTS}/test_linear.py",
    f"{KERNEL_TESTS}/test_dense_ops.py",
    f"{KERNEL_TESTS}/test_gated_activation.py",
    f"{KERNEL_TESTS}/test_step_replay.py",
    f"{KERNEL_TESTS}/test_native.py",
    f"{KERNEL_TESTS}/test_cpu_budget_kernels.py",
    f"{KERNEL_TESTS}/test_step_layout.py",
    f"{KERNEL_TESTS}/test_expert_blocks.py",
    f"{KERNEL_TESTS}/test_gguf_blocks_int8.py",
    f"{KERNEL_TESTS}/layers",
]
# what the subprocess runs: the server's build flags with ASan's appended (in place: test modules that imported the
# list see it), then pytest
BOOTSTRAP = (
    "import sys\n"
    "from engines.pytorch import native\n"
    f"native.CFLAGS.extend({FLAGS!r})\n"
    "native.BUILD_TIMEOUT = None\n"
    "import pytest\n"
    "sys.exit(pytest.main(sys.argv[1:]))\n"
)


def asan_runtime() -> str | None:
    """The path of the compiler's ASan runtime, or None when it cannot build and load a sanitized library here."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    found = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True, check=False)
    runtime = found.stdout.strip()
    if found.returncode != 0 or not os.path.isabs(runtime) or not os.path.exists(runtime):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.c"
        probe.write_text("int probe(int *p) { return p[0]; }\n")
        built = subprocess.run(
            [cc, *FLAGS, "-shared", "-fPIC", "-o", str(Path(tmp) / "probe.so"), str(probe)],
            capture_output=True,
            check=False,
        )
    return runtime if built.returncode == 0 else None


def run(tests: list[str], cache: Path, extra: list[str], timeout: float | None = None) -> subprocess.CompletedProcess:
    """pytest over `tests` with the kernels built sanitized into `cache` (output captured)."""
    runtime = asan_runtime()
    if runtime is None:
        return subprocess.CompletedProcess([], UNSUPPORTED, "", "no -fsanitize=address support here")
    env = {**os.environ, "LD_PRELOAD": runtime, "ASAN_OPTIONS": ASAN_OPTIONS, "SWITCHYARD_CACHE_DIR": str(cache)}
    cmd = [sys.executable, "-c", BOOTSTRAP, "-q", "-p", "no:cacheprovider", *extra, *tests]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subset", action="store_true", help="the CI subset, fast lane only")
    parser.add_argument("--cache", type=Path, help="the kernel cache folder (default: a fresh temporary one)")
    args, extra = parser.parse_known_args(argv)
    tests = SUBSET if args.subset else FULL
    if args.subset:
        extra = ["-m", "not slow", *extra]
    with tempfile.TemporaryDirectory(prefix="switchyard-asan-") as tmp:
        done = run(tests, args.cache or Path(tmp), extra)
    print(done.stdout[-20000:])
    print(done.stderr[-20000:], file=sys.stderr)
    if done.returncode == ASAN_EXIT or "ERROR: AddressSanitizer" in done.stderr:
        print("AddressSanitizer reported an error (above)")
        return ASAN_EXIT
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
