"""A weight's GGUF blocks packed into the kernel's panels (block_panels.py), a few panels at a time, and how a
step's rows split between the register kernels and the tile unit (`_Packed.row_parts`)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from engines.pytorch import block_panels, host_memory, kernel_modes, panel_cache
from engines.pytorch.gguf_blocks import GGUFBlocks, WeightBlocks
from engines.pytorch.kernel_modes import (
    INT8_MODE,
    ROW_TILE,
    TILE_MODE,
    TILE_UNIT_MIN_ROWS,
    TILE_UNIT_TYPES,
    _chunk,
    activations_int8,
    decode_rows_pinned,
)


class _Packed:
    """A weight's GGUF blocks as the kernel reads them: runs of panels, each of one type (segs: [end panel, type
    code] per run, ptrs: each run's panels' address). `tile_unit`: whether large steps run some of them on the tile
    unit (AMX, where the CPU has one and TILE_UNIT allows it)."""

    __slots__ = ("k", "nbytes", "nseg", "ptrs", "segs", "tensors", "tile_unit")

    def __init__(self, runs: list[tuple[int, int, torch.Tensor]], k: int, tile_unit: bool) -> None:
        """`runs`: (end panel, type code, panels) each, the panels already in host memory (`_in_pieces`); `k`: the
        weight's columns."""
        self.k, self.tile_unit = k, tile_unit
        self.tensors = [t for _, _, t in runs]
        self.segs = torch.tensor([v for end, code, _ in runs for v in (end, code)], dtype=torch.int32)
        self.ptrs = torch.tensor([t.data_ptr() for t in self.tensors], dtype=torch.int64)
        self.nseg = len(runs)
        self.nbytes = sum(t.numel() * t.element_size() for t in self.tensors)

    def row_parts(self, m: int, prompt_from: int | None) -> list[tuple[int, int, int]]:
        """The rows of a call of `m` rows as (first, end, gemm_blocks_par's `amx`) ranges: decode rows (those before
        `prompt_from`; all of them when it is None) go through the tile unit only where there are more than
        TILE_UNIT_MIN_ROWS of them (and none inside `decode_rows_on_registers`), prompt rows always. So a row's bits
        depend on its role in the step and on how many decode rows share it, never on another request's prompt
        chunk."""
        decode = m if prompt_from is None else prompt_from
        other = INT8_MODE if activations_int8() else 0
        tiles = (
            self.tile_unit and decode > TILE_UNIT_MIN_ROWS and not decode_rows_pinned() and not other,
            self.tile_unit,
        )
        modes = tuple(TILE_MODE if on else other for on in tiles)
        if modes[0] == modes[1]:
            return [(0, m, modes[0])]
        return [part for part in ((0, decode, modes[0]), (decode, m, modes[1])) if part[1] > part[0]]

    def gemm(
        self,
        lib: ctypes.CDLL,
        x: torch.Tensor,
        y: torch.Tensor,
        nb: int,
        prompt_from: int | None,
        bias: int | None = None,
        residual: torch.Tensor | None = None,
    ) -> None:
        """y = x @ W.T (+ bias, a pointer) (+ residual) over `nb` panels of these blocks, each of `row_parts` in
        its own mode (gemm_blocks_par of `lib`); x, y and residual have unit stride along a row."""
        m, k = x.shape
        ldr = residual.stride(0) if residual is not None else 0
        for a, e, mode in self.row_parts(m, prompt_from):
            r = residual[a:e].data_ptr() if residual is not None else None
            if (
                lib.gemm_blocks_par(
                    x[a:e].data_ptr(),
                    x.stride(0),
                    self.segs.data_ptr(),
                    self.ptrs.data_ptr(),
                    self.nseg,
                    bias,
                    r,
                    ldr,
                    y[a:e].data_ptr(),
                    y.stride(0),
                    e - a,
                    nb,
                    k,
                    _chunk(mode, e - a),
                    min(e - a, ROW_TILE),
                    mode,
                )
                != 0
            ):
                raise MemoryError("the GEMM kernel could not allocate its scratch")


PIECE_BYTES = 8 << 20  # file bytes of the rows packed at a time (packing takes a few times its input in scratch)


def _in_pieces(pack: Callable[[GGUFBlocks, int], torch.Tensor], parts: tuple[GGUFBlocks, ...], nb: int) -> torch.Tensor:
    """`pack(part, nb)` of each part ([NB, panel bytes] each; several parts: their panels in turn, [NB * parts, panel
    bytes]), written into one host-memory buffer a few panels at a time: a panel is made from its own 16 rows, so
    the pieces' panels are the whole's, and the scratch of packing stays a few MB however large the weight (an
    lm_head of 128k rows would need gigabytes at once). Where the model being built has saved panels
    (panel_cache.py), the parts' are read from there instead, and those packed here are saved."""
    cache = panel_cache.active()
    name = panel_cache.key([p.source for p in parts], nb) if cache is not None else None
    if cache is not None and name is not None:
        found = cache.get(name, nb * len(parts))
        if found is not None:
            return found
    n = parts[0].shape[0]
    step = max(1, PIECE_BYTES // (16 * parts[0].raw.shape[1]))
    out = None
    for a in range(0, nb, step):
        b = min(nb, a + step)
        index = torch.arange(16 * a, min(n, 16 * b))
        piece = torch.stack([pack(part.rows(index), b - a) for part in parts], dim=1)  # [panels, parts, bytes]
        if out is None:
            out = host_memory.zeros((nb, len(parts), piece.shape[-1]), torch.uint8)
        out[a:b] = piece
    panels = out.view(nb * len(parts), -1)
    if cache is not None and name is not None:
        cache.put(name, panels)
    return panels


def _pack_blocks(
    lib: ctypes.CDLL, blocks: WeightBlocks, nb: int, interleave: WeightBlocks | None = None
) -> _Packed | None:
    """`blocks` (and with `interleave`, gate and up panels in turn: one type) in the kernel's layout; None where the
    parts' rows do not fill whole panels (a weight of several types whose boundaries fall inside a panel)."""
    parts = blocks.parts
    tile_unit = kernel_modes.TILE_UNIT and any(p.qtype in TILE_UNIT_TYPES for p in parts) and bool(lib.amx_supported())
    if interleave is not None:
        if len(parts) != 1 or len(interleave.parts) != 1 or parts[0].qtype != interleave.parts[0].qtype:
            return None
        one, other = parts[0], interleave.parts[0]
        return _Packed(
            [(2 * nb, one.type.code, _in_pieces(block_panels.pack, (one, other), nb))], one.shape[1], tile_unit
        )
    runs, end = [], 0
    for i, part in enumerate(parts):
        rows = part.shape[0]
        if i < len(parts) - 1 and rows % 16:
            return None
        panels = (rows + 15) // 16
        end += panels
        runs.append((end, part.type.code, _in_pieces(block_panels.pack, (part,), panels)))
    return _Packed(runs, blocks.shape[1], tile_unit)
