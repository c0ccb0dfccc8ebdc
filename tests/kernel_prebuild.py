"""The host's two large C kernel libraries, built in the background from the session's start into the kernel cache.

gemm.c takes about 20 s of one core to compile and paged_attention.c a few more. The engine tests pass their own
tmp_path as the cache folder, so the first of them built both afresh on every run, with pytest waiting. Instead,
`tests/conftest.py` starts `KernelPrebuild` when the session begins: a thread compiles both for this CPU into the
engine's kernel cache (`SWITCHYARD_CACHE_DIR`, else ~/.cache/switchyard; keyed by sources, flags, compiler and CPU
as every build, so a later run finds them), on the second core while pytest collects; before the first test under
tests/engines/pytorch/ the session waits for it and loads both, and native.py hands that one loaded library to every
later caller in the process (it keeps one per name), whatever cache folder they name. A build that fails here is
tried again, and reported, by the tests' own load."""

from __future__ import annotations

import os
import threading
from pathlib import Path

KERNEL_TESTS = Path(__file__).resolve().parent / "engines" / "pytorch"
LIBRARIES = ("gemm", "paged_attention")  # the rest build in under a second each


def cache_root() -> Path:
    """The engine's cache folder as the server would name it with no --cache-dir."""
    env = os.environ.get("SWITCHYARD_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "switchyard"


def _covers(selected: Path) -> bool:
    """Whether a path given to pytest holds kernel tests (the suite, tests/engines/, a file under it)."""
    return selected == KERNEL_TESTS or KERNEL_TESTS.is_relative_to(selected) or selected.is_relative_to(KERNEL_TESTS)


class KernelPrebuild:
    def __init__(self) -> None:
        self.cache_dir = cache_root()
        self._thread: threading.Thread | None = None
        self._loaded = False

    def start(self, args: list[str], invocation_dir: Path) -> None:
        """Build in the background when the run's paths hold kernel tests."""
        if not any(_covers((invocation_dir / arg.split("::")[0]).resolve()) for arg in args):
            return
        self._thread = threading.Thread(target=self._build, name="kernel-prebuild", daemon=True)
        self._thread.start()

    def _build(self) -> None:
        from engines.pytorch import native

        for name in LIBRARIES:
            try:
                native._build(name, native.CSRC, self.cache_dir)
            except Exception:  # noqa: BLE001 - the tests' own load builds it again and says why it fails
                pass

    def load(self, test_path: Path) -> None:
        """Before the first kernel test: wait for the builds, and load them for the whole process."""
        if self._thread is None or self._loaded or not test_path.is_relative_to(KERNEL_TESTS):
            return
        self._thread.join()
        self._loaded = True
        from engines.pytorch import gemm_library, native, paged_attention

        native.load_library("gemm", self.cache_dir, gemm_library._SIGNATURES)
        native.load_library("paged_attention", self.cache_dir, paged_attention._SIGNATURES)

    def finish(self) -> None:
        """Leave no compiler running (nor its scratch folder in the cache) after the session."""
        if self._thread is not None:
            self._thread.join()
