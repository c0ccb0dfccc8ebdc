"""GGUF blocks (gguf_blocks.py) repacked into the GEMM kernel's panels: csrc/gemm_blocks.h reads this layout.

Why repack: the kernel computes 16 output columns side by side ([N / 16, K, 16] panels, as for float32 weights), so
it wants each k's 16 values next to each other, with each column's block scales beside them; the file stores each
row's blocks one after the other. The panels hold the same bits per weight as the file (the K-quants' 6-bit sub-block
scales and mins become bytes: +1/8 bit a weight; MXFP4's E8M0 scale byte a bfloat16: +1/4 bit), written once at
load; zero columns pad the last panel.
"""

from __future__ import annotations

import torch

from engines.pytorch.gguf_blocks import GGUFBlocks

LAYOUT = 1  # bump when `pack`'s output changes: panels saved in another layout (panel_cache.py) are then not read
_RECORD = {
    "Q4_0": 288,
    "Q4_1": 320,
    "Q5_0": 352,
    "Q5_1": 384,
    "Q8_0": 544,
    "Q4_K": 2368,
    "Q5_K": 2880,
    "Q6_K": 3360,
    "MXFP4": 288,
}


def _rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """`t` with zero rows appended up to `rows`."""
    return torch.cat((t, t.new_zeros(rows - t.shape[0], *t.shape[1:]))) if t.shape[0] < rows else t


def _per_column(t: torch.Tensor, nb: int) -> torch.Tensor:
    """A per-row field [NB * 16, X] as [NB, X, 16 columns] bytes ([NB, X, 16 * itemsize])."""
    out = t.reshape(nb, 16, -1).transpose(1, 2).contiguous()
    return out.view(torch.uint8).reshape(nb, out.shape[1], -1)


def _high_bits(q: torch.Tensor, bits: int) -> torch.Tensor:
    """The bits above the nibble of q [NB, G, 32 k, 16 columns] (1: Q5's bit 4, 2: Q6_K's bits 4-5) packed along k:
    byte j * 16 + c holds those of k = j + s i at bits `bits` * i (s = 8 / bits runs of 32 / s k): [NB, G, 64 bits]."""
    runs = 8 // bits
    high = ((q >> 4) & (2**bits - 1)).reshape(*q.shape[:2], runs, 32 // runs, 16)  # [NB, G, i, j, 16]
    shifts = (torch.arange(runs, dtype=torch.uint8) * bits).view(runs, 1, 1)
    return (high << shifts).sum(2, dtype=torch.uint8).flatten(-2)


def pack(blocks: GGUFBlocks, nb: int) -> torch.Tensor:
    """The kernel's panels of `blocks` ([N, K]) padded to `nb` panels: [NB, panel bytes] uint8 (16-bit types:
    [NB, K, 16] values as bytes, the float32 kernel's layout)."""
    n, k = blocks.shape
    rows = nb * 16
    if blocks.qtype in ("BF16", "F16"):
        w = _rows(blocks.raw.view(torch.int16).view(n, k), rows)
        return w.view(nb, 16, k).transpose(1, 2).contiguous().view(torch.uint8).reshape(nb, -1)
    f = blocks.fields()
    g = k // 32
    q = _rows(f.q, rows).view(nb, 16, g, 32).permute(0, 2, 3, 1)  # [NB, G, 32 k, 16 columns]
    nib = ((q[:, :, :16] & 15) | ((q[:, :, 16:] & 15) << 4)).reshape(nb, g, 256)
    d = _per_column(_rows(f.d, rows), nb)
    name = blocks.qtype
    if name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"):  # MXFP4: d as bfloat16, then its nibbles
        parts = [d]
        if f.m is not None:
            parts.append(_per_column(_rows(f.m, rows), nb))
        if name == "Q8_0":
            parts.append(q.reshape(nb, g, 512))
        else:
            parts.append(nib)
            if name.startswith("Q5"):
                parts.append(_high_bits(q, 1))
        records = torch.cat(parts, dim=-1)
    else:
        r = k // 256
        if name == "Q6_K":
            head = d
            groups = [_per_column(_rows(f.sc, rows), nb).view(nb, g, 32), nib, _high_bits(q, 2)]
        else:
            head = torch.cat((d, _per_column(_rows(f.m, rows), nb)), dim=-1)
            groups = [_per_column(_rows(f.sc, rows), nb), _per_column(_rows(f.mins, rows), nb), nib]
            if name == "Q5_K":
                groups.append(_high_bits(q, 1))
        records = torch.cat((head, torch.cat(groups, dim=-1).view(nb, r, -1)), dim=-1)
    assert records.shape[-1] == _RECORD[name], (name, records.shape)
    return records.reshape(nb, -1)
