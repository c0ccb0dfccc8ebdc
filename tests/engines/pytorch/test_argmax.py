"""The vectorised greedy pick against torch's argmax: first index of the maximum, ties and tails included."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.pytorch.argmax import _SIGNATURES, Argmax
from engines.pytorch.native import load_library


@pytest.mark.parametrize("width", [1, 7, 8, 9, 49152, 49155])
def test_rows_equal_torch_argmax(width: int, tmp_path: Path) -> None:
    argmax = Argmax(tmp_path)
    gen = torch.Generator().manual_seed(width)
    logits = torch.randn(6, width, generator=gen)
    logits[1] = 0.0  # all tied: index 0
    logits[2, -1] = 100.0  # the maximum in the scalar tail
    if width > 20:
        logits[3, 5] = logits[3, 17] = logits[3, -2] = 50.0  # ties in different SIMD lanes and the tail
        logits[4, 9] = logits[4, 1] = 60.0  # a later lane holds the earlier index
    logits[5] = float("-inf")
    assert argmax.rows(logits) == logits.argmax(dim=-1).tolist()
    view = torch.randn(4, width + 3, generator=gen)[:, 1 : width + 1]  # rows further apart than their length
    assert argmax.rows(view) == view.argmax(dim=-1).tolist()


@pytest.mark.parametrize("width", [7, 8, 9, 49152, 49155])
def test_the_one_pass_pick_counts_rows_that_are_not_finite(width: int, tmp_path: Path) -> None:
    """argmax_rows_finite_f32 (the replayed step's greedy pick): torch's argmax on finite rows, and how many rows hold
    a NaN or an infinity, wherever it is (first vector, middle, scalar tail)."""
    lib = load_library("argmax", tmp_path, _SIGNATURES)
    logits = torch.randn(6, width, generator=torch.Generator().manual_seed(width))
    logits[1, -1] = float("nan")
    logits[2, 0] = float("inf")
    logits[3, width // 2] = float("-inf")
    out = torch.empty(6, dtype=torch.int64)
    bad = lib.argmax_rows_finite_f32(logits.data_ptr(), logits.stride(0), 6, width, out.data_ptr())
    assert bad == 3
    finite = [0, 4, 5]
    assert out[finite].tolist() == logits[finite].argmax(dim=-1).tolist()
