"""Every GGUF type the engine keeps as blocks dequantizes exactly as gguf-py (transformers' GGUF loader) does, from
blocks made by gguf-py's quantizer or (K-quants, which it cannot make) random valid block bytes, and at the extremes
of the K-quants' and MXFP4's scales; rows, cat and the panel layout keep every weight."""

from __future__ import annotations

import re

import pytest
import torch

from engines.pytorch import block_panels
from engines.pytorch.gguf_blocks import TYPES, GGUFBlocks, MixedBlocks
from engines.pytorch.native import CSRC
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


def test_mxfp4_scales_and_values_are_ggmls() -> None:
    """Every E8M0 scale byte gguf-py's products keep finite (0 and 1: ggml's subnormal scales, 2^-128 and 2^-127)
    with every nibble in both halves of a block: gguf-py's weights, and the E2M1 table's values times the scale."""
    e = torch.arange(0, 253, dtype=torch.uint8)  # 2^124 * 12 is the largest finite product
    nibbles = torch.arange(16, dtype=torch.uint8)
    qs = (nibbles | (nibbles.flip(0) << 4)).expand(len(e), 16)  # k 0..15: nibble k; k 16..31: nibble 31 - k
    blocks = GGUFBlocks("MXFP4", torch.cat((e[:, None], qs), dim=1).contiguous())
    assert blocks.shape == (253, 32)
    ours = blocks.dequantize()
    assert torch.equal(ours, _gguf(blocks))
    values = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=torch.float64)
    want = torch.pow(2.0, e.double() - 128)[:, None] * torch.cat((values, values.flip(0)))
    assert torch.equal(ours.double(), want)


def test_cat_keeps_one_type_and_runs_of_several() -> None:
    q, k, v = make_blocks("Q5_0", 64, 256, 1), make_blocks("Q5_0", 32, 256, 2), make_blocks("Q8_0", 32, 256, 3)
    same = GGUFBlocks.cat([q, k])
    assert isinstance(same, GGUFBlocks) and same.qtype == "Q5_0" and same.shape == (96, 256)
    mixed = GGUFBlocks.cat([q, k, v])
    assert isinstance(mixed, MixedBlocks) and [p.qtype for p in mixed.parts] == ["Q5_0", "Q8_0"]
    assert mixed.shape == (128, 256) and mixed.nbytes == q.nbytes + k.nbytes + v.nbytes
    assert torch.equal(mixed.dequantize(), torch.cat([q.dequantize(), k.dequantize(), v.dequantize()]))
    assert isinstance(GGUFBlocks.cat([mixed, v]), MixedBlocks)


def test_type_codes_and_records_are_the_kernels() -> None:
    """TYPES' codes, record k and block_panels' record bytes are csrc/gemm_blocks.h's BT_*, BT_RK and BT_RECORD."""
    header = (CSRC / "gemm_blocks.h").read_text()
    enum = re.search(r"enum \{ (BT_\w+) = 1, ([^}]*) \};", header)
    assert enum is not None
    names = [enum[1], *(n.strip() for n in enum[2].split(","))]
    assert {f"BT_{t.name}": t.code for t in TYPES.values()} == {n: i + 1 for i, n in enumerate(names)}

    def table(name: str) -> list[int]:
        found = re.search(rf"static const int {name}\[\] = \{{([^}}]*)\}};", header)
        assert found is not None, name
        return [int(v) for v in found[1].split(",")]

    records, record_k = table("BT_RECORD"), table("BT_RK")
    for t in TYPES.values():
        assert record_k[t.code] == t.record_k, t.name
        if t.name in block_panels._RECORD:
            assert records[t.code] == block_panels._RECORD[t.name], t.name


@pytest.mark.parametrize("qtype", sorted(TYPES))
def test_panels_hold_the_files_bits(qtype: str) -> None:
    """The kernel's panels take the file's bytes per weight (the K-quants' 6-bit scales and mins as bytes: +1/8
    bit a weight; MXFP4's scale byte as a bfloat16: +1/4 bit) and a padded last panel."""
    blocks = make_blocks(qtype, 40, 512)
    panels = block_panels.pack(blocks, 3)
    extra = {"Q4_K": 1 / 64, "Q5_K": 1 / 64, "MXFP4": 1 / 32}.get(qtype, 0.0)
    assert panels.dtype == torch.uint8 and panels.shape[0] == 3
    assert panels.numel() / (48 * 512) == pytest.approx(blocks.nbytes / (40 * 512) + extra)
