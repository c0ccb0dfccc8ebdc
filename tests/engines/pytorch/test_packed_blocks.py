"""How a step's rows split between the register kernels and the tile unit on packed GGUF blocks
(`_Packed.row_parts`)."""

from __future__ import annotations

import torch

from engines.pytorch import kernel_modes, packed_blocks


def test_decode_rows_go_to_the_tile_unit_only_in_large_steps_prompt_rows_always() -> None:
    packed = packed_blocks._Packed([(1, 2, torch.zeros(1, 320, dtype=torch.uint8))], 32, tile_unit=True)
    big = kernel_modes.TILE_UNIT_MIN_ROWS + 1
    assert packed.row_parts(40, 5) == [(0, 5, 0), (5, 40, 1)]  # a few decode rows, then prompt rows
    assert packed.row_parts(40, None) == [(0, 40, 1)] and packed.row_parts(big + 3, big) == [(0, big + 3, 1)]
    assert packed.row_parts(10, None) == [(0, 10, 0)] and packed.row_parts(10, 10) == [(0, 10, 0)]
    assert packed.row_parts(12, 0) == [(0, 12, 1)]  # a prefill alone
    off = packed_blocks._Packed([(1, 2, torch.zeros(1, 320, dtype=torch.uint8))], 32, tile_unit=False)
    assert off.row_parts(40, 5) == [(0, 40, 0)]
