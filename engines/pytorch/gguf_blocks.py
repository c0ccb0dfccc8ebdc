"""Projection weights kept as a GGUF file's quantized blocks, for the GEMM kernel to expand as it runs.

Why: a decode step of a few rows is bound by how fast each core streams weights from memory, and a quantized file
holds 4.5-8.5 bits a weight where float32 takes 32. So the projections and the lm_head keep the file's own blocks
(`GGUFBlocks`: each row's blocks as the file stores them, the file's bytes per weight exactly), and the kernel reads
a repacked copy of those (block_panels.py) instead of a float32 weight.

Exactness: gguf-py (which transformers uses to load a GGUF) dequantizes every type as one float32 rounding of an
exact value: Q4_0 d*(q-8), Q5_0 d*(q-16), Q8_0 d*q, Q4_1/Q5_1 d*q+m, Q4_K/Q5_K (d*sc)*q-(dmin*m), Q6_K
(d*sc)*(q-32), with float16 d, dmin, m and small integers q, sc, m (d*sc and dmin*m are exact in float32: 11 x 8
significant bits at most); MXFP4 d*v with d = 2^(e-128) from the block's E8M0 byte e and v the E2M1 value of the
weight's nibble, doubled (0, 1, 2, 3, 4, 6, 8, 12 and their negatives; ggml's table and scale); F16/BF16 widen
exactly. `dequantize` computes the same float32 operations, so it equals gguf-py's result (tests compare), and the
kernel's fma(A, q, B) with those exact A, B (MXFP4: A = d, q = v, B = -0) rounds the same exact value once: the same
weight (up to the sign of a zero weight, which no sum can tell), and so the float32 kernel's bits. gguf_weights.py
takes only tensors whose expansion equals gguf-py's, bit for bit (checked as it reads the file).

MXFP4 is not d*q+m in its nibble q (the E2M1 values are not evenly spaced), so the kernels look v up by q: a byte
permute of the nibbles (csrc/gemm_blocks.h). Its panels hold d as a bfloat16 (2^(e-128) is exact there, subnormal
for e < 2 as in ggml; widening is a shift), so a record is Q4_0's: 1/32 byte a weight more than the file.

Bytes per weight (the file's): Q4_0 0.5625, Q4_1 0.625, Q5_0 0.6875, Q5_1 0.75, Q8_0 1.0625, Q4_K 0.5625, Q5_K
0.6875, Q6_K 0.8203, MXFP4 0.53125, F16/BF16 2 (float32: 4).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class BlockType:
    """A GGUF tensor type the kernels read: `code` (csrc/gemm_blocks.h's BT_*), weights and bytes per file block,
    and k per record of the kernel's panels (block_panels.py)."""

    name: str
    code: int
    block: int
    block_bytes: int
    record_k: int


TYPES = {
    t.name: t
    for t in (
        BlockType("Q4_0", 1, 32, 18, 32),
        BlockType("Q4_1", 2, 32, 20, 32),
        BlockType("Q5_0", 3, 32, 22, 32),
        BlockType("Q5_1", 4, 32, 24, 32),
        BlockType("Q8_0", 5, 32, 34, 32),
        BlockType("Q4_K", 6, 256, 144, 256),
        BlockType("Q5_K", 7, 256, 176, 256),
        BlockType("Q6_K", 8, 256, 210, 256),
        BlockType("BF16", 9, 1, 2, 1),
        BlockType("F16", 10, 1, 2, 1),
        BlockType("MXFP4", 11, 32, 17, 32),
    )
}
# MXFP4's values by nibble: E2M1 doubled, as ggml's kvalues_mxfp4 (its scale is halved to match)
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


@dataclass(frozen=True)
class Fields:
    """A quantized weight's blocks decoded (rows x blocks): q the unsigned code per weight (Q8_0: its int8's byte;
    MXFP4: its nibble), d the float16 scale per block (per super-block for the K-quants; MXFP4: bfloat16, 2^(e-128)),
    m the float16 offset (Q4_1, Q5_1) or dmin (Q4_K, Q5_K), sc and mins the K-quants' sub-block scales (Q6_K: int8
    per 16 weights) and mins."""

    q: torch.Tensor  # [N, K] uint8
    d: torch.Tensor  # [N, blocks] float16 (MXFP4: bfloat16)
    m: torch.Tensor | None = None  # [N, blocks] float16
    sc: torch.Tensor | None = None  # [N, K / 32] uint8 (Q6_K: [N, K / 16] int8)
    mins: torch.Tensor | None = None  # [N, K / 32] uint8


class WeightBlocks(Protocol):
    """A [N, K] weight held as GGUF blocks: what Linear and the model runner take (one type, or rows of several)."""

    @property
    def shape(self) -> tuple[int, int]: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def parts(self) -> tuple[GGUFBlocks, ...]: ...

    def dequantize(self) -> torch.Tensor: ...

    def rows(self, index: torch.Tensor) -> WeightBlocks: ...


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """Two bytes per block ([..., 2] uint8) as a float16 per block."""
    return raw.contiguous().view(torch.float16).squeeze(-1)


def _bits(raw: torch.Tensor) -> torch.Tensor:
    """Bytes [..., B] as their 8 B bits, least significant first: [..., 8 B] uint8."""
    return ((raw[..., None] >> torch.arange(8, dtype=torch.uint8)) & 1).flatten(-2)


def _nibbles(raw: torch.Tensor, span: int) -> torch.Tensor:
    """Bytes in runs of `span`: each run's low nibbles, then its high nibbles (GGUF's order)."""
    runs = raw.unflatten(-1, (-1, span))
    return torch.stack((runs & 15, runs >> 4), dim=-2).flatten(-3)


def file_view(data: Any) -> torch.Tensor:
    """`data`, a numpy view of gguf-py's read-only mapping of a file, as a tensor without a copy (torch warns that
    it is not writable: blocks are only ever read)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(data)


@dataclass(frozen=True)
class GGUFBlocks:
    """A [N, K] weight as one GGUF type's blocks: each row's blocks as the file stores them (`raw`). `source`: the
    module path the blocks were read as (several joined by "+" for a fused weight), the name of their packed panels
    in panel_cache.py; None for rows taken out of a weight."""

    qtype: str
    raw: torch.Tensor  # [N, K / block * block_bytes] uint8
    source: str | None = None

    @property
    def type(self) -> BlockType:
        return TYPES[self.qtype]

    @property
    def shape(self) -> tuple[int, int]:
        t = self.type
        return self.raw.shape[0], self.raw.shape[1] // t.block_bytes * t.block

    @property
    def nbytes(self) -> int:
        return self.raw.numel()

    @property
    def parts(self) -> tuple[GGUFBlocks, ...]:
        return (self,)

    def fields(self) -> Fields:
        t, (n, k) = self.type, self.shape
        b = self.raw.view(n, k // t.block, t.block_bytes)
        name = self.qtype
        if name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
            with_m = name in ("Q4_1", "Q5_1")
            at = 4 if with_m else 2
            m = _f16(b[..., 2:4]) if with_m else None
            if name == "Q8_0":
                q = b[..., 2:]
            elif name.startswith("Q5"):
                q = _nibbles(b[..., at + 4 :], 16) | (_bits(b[..., at : at + 4]) << 4)
            else:
                q = _nibbles(b[..., at:], 16)
            return Fields(q.reshape(n, k), _f16(b[..., 0:2]), m)
        if name in ("Q4_K", "Q5_K"):
            s = b[..., 4:16].unflatten(-1, (3, 4))
            lo, hi, mix = s[..., 0, :], s[..., 1, :], s[..., 2, :]
            sc = torch.cat((lo & 63, (mix & 15) | ((lo >> 2) & 48)), dim=-1)
            mins = torch.cat((hi & 63, (mix >> 4) | ((hi >> 2) & 48)), dim=-1)
            if name == "Q4_K":
                q = _nibbles(b[..., 16:], 32)
            else:  # bit j of qh byte l: weight 32 j + l
                high = ((b[..., 16:48, None] >> torch.arange(8, dtype=torch.uint8)) & 1).transpose(-1, -2).flatten(-2)
                q = _nibbles(b[..., 48:], 32) | (high << 4)
            return Fields(q.reshape(n, k), _f16(b[..., 0:2]), _f16(b[..., 2:4]), sc.reshape(n, -1), mins.reshape(n, -1))
        if name == "Q6_K":
            low = _nibbles(b[..., :128], 64)
            qh = b[..., 128:192].unflatten(-1, (2, 32))  # per half of 128: shifts 0, 2, 4, 6 -> weights 32 s + l
            high = ((qh[..., None, :] >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8)[:, None]) & 3).flatten(-3)
            q = low | (high << 4)
            return Fields(q.reshape(n, k), _f16(b[..., 208:210]), sc=b[..., 192:208].view(torch.int8).reshape(n, -1))
        if name == "MXFP4":  # [e] then 16 bytes: k 0..15 in the low nibbles, 16..31 in the high ones
            e = b[..., 0].to(torch.int16)
            d = torch.where(e < 2, 32 * (e + 1), (e - 1) << 7)  # 2^(e-128) as bfloat16 bits: ggml's, subnormals too
            return Fields(_nibbles(b[..., 1:], 16).reshape(n, k), d.view(torch.bfloat16))
        raise TypeError(f"{name} has no quantized fields")

    def dequantize(self) -> torch.Tensor:
        """The float32 weight, computed as gguf-py computes it (the same float32 operations)."""
        n, k = self.shape
        if self.qtype == "BF16":
            return (self.raw.view(torch.int16).to(torch.int32) << 16).view(torch.float32).view(n, k)
        if self.qtype == "F16":
            return self.raw.view(torch.float16).float().view(n, k)
        f = self.fields()
        d = f.d.float()
        if self.qtype in ("Q4_K", "Q5_K"):
            scale = (d[..., None] * f.sc.view(n, -1, 8).float()).reshape(n, -1, 1)
            low = (f.m.float()[..., None] * f.mins.view(n, -1, 8).float()).reshape(n, -1, 1)
            return (scale * f.q.view(n, -1, 32).float() - low).view(n, k)
        if self.qtype == "Q6_K":
            scale = (d[..., None] * f.sc.view(n, -1, 16).float()).reshape(n, -1, 1)
            return (scale * (f.q.view(n, -1, 16).view(torch.int8) - 32).float()).view(n, k)
        if self.qtype == "MXFP4":
            values = torch.tensor(MXFP4_VALUES, dtype=torch.float32)[f.q.long()]
            return (d[..., None] * values.view(n, -1, 32)).view(n, k)
        blocks = f.q.view(n, -1, 32)
        if self.qtype == "Q8_0":
            return (blocks.view(torch.int8).float() * d[..., None]).view(n, k)
        if f.m is not None:  # Q4_1, Q5_1
            return (d[..., None] * blocks.float() + f.m.float()[..., None]).view(n, k)
        centre = 8 if self.qtype == "Q4_0" else 16
        return (d[..., None] * (blocks.to(torch.int16) - centre).float()).view(n, k)

    def rows(self, index: torch.Tensor) -> GGUFBlocks:
        return GGUFBlocks(self.qtype, self.raw[index])

    @staticmethod
    def cat(parts: list[WeightBlocks]) -> WeightBlocks:
        """The rows of several weights, one after the other (q, k and v as one projection; gate and up): one type's
        blocks when they share it, else `MixedBlocks`."""
        flat = [p for part in parts for p in part.parts]
        if all(p.qtype == flat[0].qtype for p in flat):
            return GGUFBlocks(flat[0].qtype, torch.cat([p.raw for p in flat]), _joined(flat))
        merged: list[GGUFBlocks] = []
        for p in flat:  # neighbours of one type as one part
            if merged and merged[-1].qtype == p.qtype:
                merged[-1] = GGUFBlocks(p.qtype, torch.cat((merged[-1].raw, p.raw)), _joined([merged[-1], p]))
            else:
                merged.append(p)
        return MixedBlocks(tuple(merged))


def _joined(parts: list[GGUFBlocks]) -> str | None:
    """The source of `parts`' rows one after the other (None where one has none)."""
    sources = [p.source for p in parts]
    return None if None in sources else "+".join(s for s in sources if s is not None)


@dataclass(frozen=True)
class MixedBlocks:
    """The rows of weights of several types, one after the other (e.g. a Q4_K_M file's q, k as Q4_K and v as Q6_K)."""

    parts: tuple[GGUFBlocks, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return sum(p.shape[0] for p in self.parts), self.parts[0].shape[1]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts])

    def rows(self, index: torch.Tensor) -> WeightBlocks:
        raise NotImplementedError("rows of a fused weight of several types; take rows of each part before cat")
