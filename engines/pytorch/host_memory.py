"""Large tensors backed by 2 MiB pages: the KV cache and the packed weights, which every step streams through.

With 4 KiB pages a decode step walks the page tables for every 4 KiB of the half gigabyte of weights and of the
scattered KV blocks it reads: misses the hardware prefetcher cannot hide. Linux gives an anonymous mapping
transparent huge pages when asked (`MADV_HUGEPAGE`; most distributions set THP to `madvise`), so these tensors
come from their own mapping, aligned to 2 MiB and advised. The mapping is zero-filled and faulted in lazily, as
`torch.zeros` is: an unused KV pool costs no resident memory. Where the advice is not available the tensor is an
ordinary one.

`keep_freed_memory` stops glibc's malloc from handing each step's large buffers back to the OS only to fault them
in again, zeroed, on the next step; `release_freed` hands back, once, what loading freed (the float32 weights the
engine replaced by packed copies and GGUF blocks), which that setting would otherwise keep in the heap.
"""

from __future__ import annotations

import ctypes
import mmap
import platform
from typing import Any

import torch

HUGE_PAGE = 2 << 20
MIN_BYTES = HUGE_PAGE  # smaller tensors would not fill a huge page


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor of `shape`, on huge pages where the OS offers them."""
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    if nbytes < MIN_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.zeros(shape, dtype=dtype)
    # private and anonymous: zero-filled, faulted in on first touch (a shared one would be shmem, not THP)
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # THP disabled in this kernel: ordinary pages, still correct
        pass
    raw = torch.frombuffer(region, dtype=torch.uint8)  # keeps `region` alive as long as any view of it
    offset = -raw.data_ptr() % HUGE_PAGE
    return raw[offset : offset + nbytes].view(dtype).view(shape)


def copy(src: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of `src` on huge pages where the OS offers them."""
    out = zeros(tuple(src.shape), src.dtype)
    out.copy_(src)
    return out


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
MMAP_THRESHOLD = 32 << 20  # the largest glibc accepts on 64-bit: buffers up to this size come from the heap
TRIM_THRESHOLD = 1 << 30  # free heap memory kept for the next step before any is returned to the OS


def _glibc(name: str) -> Any:
    """glibc's function `name` through ctypes, or None off Linux/glibc (the allocator knobs are glibc's own)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def keep_freed_memory() -> bool:
    """Keep freed buffers in the process (glibc only; elsewhere a no-op that returns False).

    By default glibc serves every allocation above a threshold (128 KiB, adapting up to 32 MiB) from its own
    mapping and unmaps it on free; a step's activations (25 MB for the MLP of a 2048-token prefill) are then
    faulted in again, 4 KiB at a time and zeroed by the kernel, at every step: 170-195 thousand page faults per
    prefill step here, a fifth of its time. A fixed threshold and a high trim threshold keep them in the heap
    for reuse. Peak memory is unchanged; what the process holds between steps is at most one step's buffers.
    This is what vLLM-CPU gets from preloading tcmalloc.
    """
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def release_freed() -> bool:
    """Return the heap's free memory to the OS now (glibc's malloc_trim; elsewhere a no-op that returns False).

    Why: loading frees far more than a step ever allocates (the float32 model transformers built, once its weights
    are packed or read from GGUF blocks), and with `keep_freed_memory`'s trim threshold glibc would keep up to a
    gigabyte of it resident for good. Called once the engine is built; later steps reuse what stays."""
    trim = _glibc("malloc_trim")
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))
