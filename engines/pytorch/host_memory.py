"""Large tensors backed by 2 MiB pages: the KV cache and the packed weights, which every step streams through.

With 4 KiB pages a decode step walks the page tables for every 4 KiB of the half gigabyte of weights and of the
scattered KV blocks it reads: misses the hardware prefetcher cannot hide. Linux gives an anonymous mapping
transparent huge pages when asked (`MADV_HUGEPAGE`; most distributions set THP to `madvise`), so these tensors
come from their own mapping, aligned to 2 MiB and advised. The mapping is zero-filled and faulted in lazily, as
`torch.zeros` is: an unused KV pool costs no resident memory. Where the advice is not available the tensor is an
ordinary one.
"""

from __future__ import annotations

import mmap

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
