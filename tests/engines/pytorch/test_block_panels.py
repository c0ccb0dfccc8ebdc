"""The panels' layouts read back: rows of a weight in the tile unit's layout (an lm_head on an AMX CPU, whose tied
embedding reads its rows from there) equal gguf-py's dequantized rows. Pure torch: runs on any CPU."""

from __future__ import annotations

import pytest
import torch

from engines.pytorch import block_panels
from tests.random_gguf_blocks import make_blocks


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_tile_unit_rows_are_the_dequantized_rows(qtype: str) -> None:
    n, k = 600, 576  # a padded last panel; more rows than one gather's chunk
    blocks = make_blocks(qtype, n, k, seed=5)
    panels = block_panels.pack_tile_unit(blocks, (n + 15) // 16)
    index = torch.cat((torch.randperm(n, generator=torch.Generator().manual_seed(2)), torch.tensor([n - 1, 0])))
    assert torch.equal(block_panels.tile_unit_rows(panels, k, index), blocks.dequantize()[index])  # -0.0 == 0.0
