"""Tensors on huge pages behave as torch.zeros / .contiguous() do, whatever the OS grants; freed step buffers
are reused without page faults."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest
import torch

from engines.pytorch import host_memory


def test_large_zeros_are_zero_aligned_and_writable() -> None:
    t = host_memory.zeros((3, 1024, 1024), torch.float32)  # 12 MiB
    assert t.shape == (3, 1024, 1024) and t.dtype == torch.float32 and t.is_contiguous()
    assert t.data_ptr() % host_memory.HUGE_PAGE == 0
    assert not t.any()
    t[1, 5, 7] = 2.5
    assert float(t.sum()) == 2.5


def test_small_tensors_are_ordinary() -> None:
    t = host_memory.zeros((4, 8), torch.bfloat16)
    assert t.shape == (4, 8) and t.dtype == torch.bfloat16 and not t.any()


def test_copy_keeps_values_and_outlives_the_source() -> None:
    src = torch.randn(64, 3, 4096)  # 3 MiB, a strided view below
    view = src.transpose(0, 1)
    out = host_memory.copy(view)
    assert out.is_contiguous() and torch.equal(out, view)
    del src, view
    assert out.shape == (3, 64, 4096) and torch.isfinite(out).all()


# A fresh process runs "steps" on a worker thread, as the server does: each allocates and frees activations of a
# 2048-token prefill's size (25 MB for the MLP's gate and up projections). The last step's page faults count
# what the kernel had to map and zero again: one per 4 KiB when malloc gave the memory back to the OS.
_REFAULTS = """
import resource, sys, threading, torch
from engines.pytorch import host_memory
assert host_memory.keep_freed_memory() if sys.argv[1] == "keep" else True
def step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(2048, 576)
    for _ in range(4):
        gate_up = torch.ones(2048, 3072)
        act = gate_up[:, :1536] * gate_up[:, 1536:]
        del gate_up
        qkv = torch.ones(2048, 960)
        x = x + act[:, :576] + qkv[:, :576]
        del act, qkv
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults = []
worker = threading.Thread(target=lambda: faults.extend(step() for _ in range(6)))
worker.start()
worker.join()
print(faults[-1])
"""


@pytest.mark.slow  # two Python processes that import torch: seconds each
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_freed_step_buffers_are_reused_without_page_faults() -> None:
    def refaults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _REFAULTS, mode], capture_output=True, text=True, check=True)
        return int(out.stdout.split()[-1])

    assert refaults("default") > 1000  # glibc's default: the buffers come from fresh mappings at every step
    assert refaults("keep") < 100


def _rss_file() -> int:
    """This process's resident pages of mapped files, in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssFile:"))


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="madvise via glibc")
def test_dropped_file_pages_leave_the_resident_set_and_read_back_the_same(tmp_path) -> None:
    data = torch.randint(0, 256, (32 << 20,), dtype=torch.uint8)
    path = tmp_path / "weights.bin"
    data.numpy().tofile(path)
    mapped = torch.from_file(str(path), shared=False, size=data.numel(), dtype=torch.uint8)  # a private mapping
    view = mapped[4097 : (24 << 20) + 5]  # not page-aligned at either end
    assert torch.equal(view, data[4097 : (24 << 20) + 5])  # read: resident
    before = _rss_file()
    assert host_memory.drop_file_pages(view)
    assert before - _rss_file() > 23 << 20  # its whole pages left; partial pages at the ends stay
    assert torch.equal(mapped, data)  # faulted in from the file again, the same bytes


def test_loading_returns_freed_buffers_and_serving_keeps_them() -> None:
    if platform.libc_ver()[0] == "glibc":
        assert host_memory.return_freed_memory() and host_memory.keep_freed_memory()
    else:
        assert not host_memory.return_freed_memory()
