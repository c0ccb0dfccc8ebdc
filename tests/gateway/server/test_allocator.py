"""`--malloc-arenas`: the cap holds in a process whose threads allocate (counted from its memory, as the soak
counts the server's), 0 leaves glibc's default, a defaulted cap leaves `MALLOC_ARENA_MAX` as the environment set
it, and a wrong value names the flag and the fix."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from gateway.cli import load_config
from gateway.errors import ConfigError
from gateway.server.allocator import cap_arenas
from tests.conftest import ROOT

THREADS = 8
# Starts THREADS threads that each allocate, with all of them alive, then prints the process's arena count.
PROBE = f"""
import ctypes, os, sys, threading
from bench.soak import malloc_arenas
from gateway.server.allocator import cap_arenas
capped = cap_arenas(int(sys.argv[1]))
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
started, done = threading.Barrier({THREADS} + 1), threading.Event()
def work():
    libc.malloc(4096)
    started.wait()
    done.wait()
threads = [threading.Thread(target=work) for _ in range({THREADS})]
for t in threads:
    t.start()
started.wait()
print(capped, malloc_arenas(os.getpid()))
done.set()
"""

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's"
)


def _arenas(cap: int, arena_max: str | None = None) -> tuple[str, int]:
    """(whether the probe set a cap, its arena count), under MALLOC_ARENA_MAX=`arena_max` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    env.update({"MALLOC_ARENA_MAX": arena_max} if arena_max else {})
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(cap)], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    capped, arenas = out.stdout.split()
    return capped, int(arenas)


@glibc_only
def test_the_cap_holds_while_threads_allocate() -> None:
    assert _arenas(2) == ("True", 2)
    assert _arenas(3) == ("True", 3)
    assert _arenas(2, arena_max="8") == ("True", 2)  # given, the setting wins over the environment


@glibc_only
def test_zero_leaves_glibcs_arena_per_thread() -> None:
    """The control: uncapped, each thread that allocates gets an arena of its own (glibc allows 8 per core)."""
    capped, arenas = _arenas(0)
    assert capped == "False" and arenas > 2


def test_a_defaulted_cap_keeps_malloc_arena_max_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert cap_arenas(2, given=False) is False  # glibc read the variable at startup; the default leaves it
    assert cap_arenas(0) is False


def test_the_setting_by_flag_and_environment() -> None:
    assert load_config([], environ={}).malloc_arenas == 2
    assert load_config(["--malloc-arenas", "4"], environ={}).malloc_arenas == 4
    assert load_config([], environ={"SWITCHYARD_MALLOC_ARENAS": "0"}).malloc_arenas == 0


@pytest.mark.parametrize("value", ["-1", "two", "100000"])
def test_a_wrong_value_names_the_flag_and_the_fix(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(["--malloc-arenas", value], environ={})
    message = str(caught.value)
    assert "--malloc-arenas" in message and "give --malloc-arenas a valid value" in message, message
    assert value in message
