"""Fixtures shared by the native engine's kernel tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread for the test: the kernels are single-threaded, and the engine runs them with one torch
    thread, so comparisons against torch use the same."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
