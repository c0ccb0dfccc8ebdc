"""Large tensors backed by 2 MiB pages: the KV cache and the packed weights, which every step streams through.

With 4 KiB pages a decode step walks the page tables for every 4 KiB of the half gigabyte of weights and of the
scattered KV blocks it reads: misses the hardware prefetcher cannot hide. Linux gives an anonymous mapping
transparent huge pages when asked (`MADV_HUGEPAGE`; most distributions set THP to `madvise`), so these tensors
come from their own mapping, aligned to 2 MiB and advised. The mapping is zero-filled and faulted in lazily, as
`torch.zeros` is: an unused KV pool costs no resident memory. Where the advice is not available the tensor is an
ordinary one.

The rest sets how much memory loading holds at its peak and serving keeps. `return_freed_memory` (while loading)
hands each weight's packing scratch back as soon as it is freed, where glibc's default would grow a fragmented heap;
`drop_file_pages` takes the cache file's pages of a weight out of the resident set once it is packed, so loading
holds the packed weights and one weight's file pages, not the whole file as well. `keep_freed_memory` (once
loaded) stops glibc's malloc from handing each step's large buffers back to the OS only to fault them in again,
zeroed, on the next step; `release_freed` hands back, once, what loading freed (the float32 weights the engine
replaced by packed copies and GGUF blocks), which that setting would otherwise keep in the heap.
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
LOAD_MMAP_THRESHOLD = 128 << 10  # glibc's initial threshold, fixed: loading's buffers go back on free


def _glibc(name: str) -> Any:
    """glibc's function `name` through ctypes, or None off Linux/glibc (the allocator knobs are glibc's own)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def return_freed_memory() -> bool:
    """Hand every freed buffer above 128 KiB back to the OS at once (glibc only; elsewhere a no-op that returns
    False): the setting for loading, which makes and frees a few MB of packing scratch per weight. glibc's default
    raises its threshold as buffers are freed, after which they come from a heap that fragments and keeps growing
    (70-100 MB over SmolLM2's load). `keep_freed_memory` is the setting for serving, once loaded."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, LOAD_MMAP_THRESHOLD))


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


def drop_file_pages(t: torch.Tensor) -> bool:
    """Take the whole pages under `t`, a view of a read-only file's mapping, out of the resident set (Linux
    madvise MADV_DONTNEED; elsewhere a no-op that returns False). Why: weights read from a mapped file are packed
    into their own memory, and the file pages they were read from would stay resident, counted as this process's,
    as long as the mapping lives (the whole file again). A later read faults them in from the file: the contents
    never change, since nothing writes to such a view."""
    madvise = _glibc("madvise")
    if madvise is None or not hasattr(mmap, "MADV_DONTNEED") or t.numel() == 0:
        return False
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    page = mmap.PAGESIZE
    start = -(-t.data_ptr() // page) * page  # whole pages only: a neighbour's partial page stays as it is
    end = (t.data_ptr() + t.numel() * t.element_size()) // page * page
    return end <= start or madvise(start, end - start, mmap.MADV_DONTNEED) == 0
