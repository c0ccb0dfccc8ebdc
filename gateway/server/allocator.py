"""How many malloc arenas the server's threads share (`--malloc-arenas`), set before its threads start.

glibc gives each thread that allocates an arena of its own, up to 8 per core, and an arena keeps what it once held:
the native engine sets a trim threshold of 1 GiB so that a step's buffers are reused rather than faulted in again
(engines/pytorch/host_memory.py), and an arena's heap is only handed back past that. The server's threads (the
event loop's executor, the engines' step threads, tokenizers, gRPC, the HTTP workers) had 16 arenas on 2 cores from
startup on; capped at 2, a 10-minute soak held about 27 MiB less free memory in them at the same speed of growth
(docs/reliability.md, "Soak"). Python allocates under its global lock, so more arenas buy a Python server little;
two is what Python and Ruby servers commonly set (`MALLOC_ARENA_MAX=2`).
Elsewhere (musl, macOS) there are no such arenas and the setting does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

log = logging.getLogger("switchyard")

M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)
ENV = "MALLOC_ARENA_MAX"  # glibc's own variable, read when the process starts


def cap_arenas(arenas: int, *, given: bool = True) -> bool:
    """Let the process's threads share at most `arenas` malloc arenas (the main one included); 0 leaves glibc's
    default. Call before the server starts its threads: a thread keeps the arena it was first given, and glibc
    fixes its limit once more than 8 exist. `given`: the setting was given rather than defaulted; a default does
    not override `MALLOC_ARENA_MAX` in the environment. True when the cap is set."""
    if arenas == 0:
        return False
    if not given and os.environ.get(ENV, "").strip():
        log.debug("malloc arenas: %s=%s in the environment is kept", ENV, os.environ[ENV])
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        log.debug("malloc arenas: not glibc (%s), nothing to cap", platform.libc_ver()[0] or platform.system())
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = bool(mallopt(M_ARENA_MAX, arenas))
    log.debug("malloc arenas: at most %d (%s)", arenas, "set" if done else "refused by mallopt")
    return done
