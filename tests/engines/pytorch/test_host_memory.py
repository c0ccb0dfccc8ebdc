"""Tensors on huge pages behave as torch.zeros / .contiguous() do, whatever the OS grants."""

from __future__ import annotations

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
