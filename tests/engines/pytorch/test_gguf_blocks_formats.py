"""Every GGUF type the engine keeps as blocks dequantizes exactly as gguf-py (transformers' GGUF loader) does, from
blocks made by gguf-py's quantizer or (K-quants, which it cannot make) random valid block bytes; rows, cat and the
panel layout keep every weight."""

from __future__ import annotations

import pytest
import torch

from engines.pytorch import block_panels
from engines.pytorch.gguf_blocks import TYPES, GGUFBlocks, MixedBlocks
from tests.random_gguf_blocks import K_QUANTS, make_blocks

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402


def _gguf(blocks: GGUFBlocks) -> torch.Tensor:
    return torch.from_numpy(dequantize(blocks.raw.numpy(), GGMLQuantizationType[blocks.qtype]))


@pytest.mark.parametrize("qtype", sorted(TYPES))
def test_dequantize_is_gguf_pys(qtype: str) -> None:
    blocks = make_blocks(qtype, 40, 512, seed=len(qtype))
    assert blocks.shape == (40, 512)
    assert torch.equal(blocks.dequantize(), _gguf(blocks))
    t = TYPES[qtype]
    assert blocks.nbytes == 40 * 512 // t.block * t.block_bytes  # the file's own bytes, nothing more
    index = torch.tensor([5, 0, 39])
    assert torch.equal(blocks.rows(index).dequantize(), blocks.dequantize()[index])


@pytest.mark.parametrize("qtype", K_QUANTS)
def test_k_quant_extremes_are_exact(qtype: str) -> None:
    """Largest sub-block scales and mins, subnormal and large float16 d: still gguf-py's float32 values."""
    blocks = make_blocks(qtype, 16, 256, seed=3)
    raw = blocks.raw.view(16, -1).clone()
    d = torch.tensor([6e-8, 1e-5, 3.0, 60000.0] * 4, dtype=torch.float16).view(torch.uint8).view(16, 2)
    if qtype == "Q6_K":
        raw[:, 208:210] = d
        raw[:, 192:208] = torch.tensor([127, 128, 255, 1] * 4, dtype=torch.uint8)
    else:
        raw[:, 0:2], raw[:, 2:4] = d, d.flip(0)
        raw[:, 4:16] = 255
    extreme = GGUFBlocks(qtype, raw)
    assert torch.equal(extreme.dequantize(), _gguf(extreme))


def test_cat_keeps_one_type_and_runs_of_several() -> None:
    q, k, v = make_blocks("Q5_0", 64, 256, 1), make_blocks("Q5_0", 32, 256, 2), make_blocks("Q8_0", 32, 256, 3)
    same = GGUFBlocks.cat([q, k])
    assert isinstance(same, GGUFBlocks) and same.qtype == "Q5_0" and same.shape == (96, 256)
    mixed = GGUFBlocks.cat([q, k, v])
    assert isinstance(mixed, MixedBlocks) and [p.qtype for p in mixed.parts] == ["Q5_0", "Q8_0"]
    assert mixed.shape == (128, 256) and mixed.nbytes == q.nbytes + k.nbytes + v.nbytes
    assert torch.equal(mixed.dequantize(), torch.cat([q.dequantize(), k.dequantize(), v.dequantize()]))
    assert isinstance(GGUFBlocks.cat([mixed, v]), MixedBlocks)


@pytest.mark.parametrize("qtype", sorted(TYPES))
def test_panels_hold_the_files_bits(qtype: str) -> None:
    """The kernel's panels take the file's bytes per weight (the K-quants' 6-bit scales and mins as bytes: +1/8
    bit a weight) and a padded last panel."""
    blocks = make_blocks(qtype, 40, 512)
    panels = block_panels.pack(blocks, 3)
    extra = {"Q4_K": 1 / 64, "Q5_K": 1 / 64}.get(qtype, 0.0)
    assert panels.dtype == torch.uint8 and panels.shape[0] == 3
    assert panels.numel() / (48 * 512) == pytest.approx(blocks.nbytes / (40 * 512) + extra)
