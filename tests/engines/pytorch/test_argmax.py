"""The vectorised greedy pick against torch's argmax: first index of the maximum, ties and tails included."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.pytorch.argmax import Argmax


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
