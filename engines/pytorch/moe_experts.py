"""A sparse MoE block's routing, experts and combination in one C call (csrc/moe.c), so that an MoE model's decode
steps are kernel calls only and the step replay (step_replay.py) replays them.

Why: routing (softmax, top-k, the weights) and grouping a step's rows by expert are data-dependent torch ops in the
Python block (layers/moe.py); the replay refuses any torch op that computes, so every decode step of Qwen3-MoE or
Mixtral ran from Python. Here the router's projection stays a recorded `Linear` call and everything after it is
one call of `moe_experts_f32`, which routes each row from the router's logits (transformers' order: softmax in
float32, torch.topk's choice among ties, the k weights divided by their sum where the family normalises), runs each
chosen expert once over the rows that chose it on csrc/gemm.c's kernels (the same jobs as the experts' own
`GatedActivation` and `Linear`: their packed float32 panels or GGUF blocks, read in place; experts no row chose are
not read), and adds the weighted sum, slot by slot, to the residual. The replay records that call with the step's
buffers; which experts run is decided inside it, step by step.

Taken where every projection of the block is on the float32 kernels (the experts' gate-up the fused SiLU job, the
down projections packed float32 panels or GGUF blocks, no bias); otherwise (bfloat16, torch's projections, another
activation) the block stays the Python one.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import torch

from engines.pytorch import linear
from engines.pytorch.linear import GatedActivation, Linear
from engines.pytorch.native import Signatures, load_library

_p, _i64, _i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# csrc/moe.c
SIGNATURES: Signatures = {
    "moe_max_experts": (_i32, []),
    "moe_max_top_k": (_i32, []),
    # logits, ldl, M, E, k, normalize, chosen, weights
    "moe_route_f32": (_i32, [_p, _i64, _i32, _i32, _i32, _i32, _p, _p]),
    # logits, ldl, x, ldx, residual, ldr, out, ldo, M, H, I, table, scratch, iscratch, ldg, ldd, prompt_from, flags
    "moe_experts_f32": (
        _i32,
        [_p, _i64, _p, _i64, _p, _i64, _p, _i64, _i32, _i32, _i32, _p, _p, _p, _i64, _i64, _i32, _i32],
    ),
}
# the table's layout (csrc/moe.c)
T_GROUPED, T_HEADER, P_WORDS = 7, 8, 8
K_SILU_PANELS, K_SILU_BLOCKS, K_F32, K_F32_PAR, K_BLOCKS = range(5)
F_PINNED, F_INT8 = 1, 2


def library(cache_dir: Path | None) -> ctypes.CDLL | None:
    """csrc/moe.c, built for this CPU (None without a compiler)."""
    return load_library("moe", cache_dir, SIGNATURES)


def _address(lib: ctypes.CDLL, name: str) -> int:
    # lib[name] is a fresh function object: its address even while a recorder has wrapped the attribute
    return ctypes.cast(lib[name], ctypes.c_void_p).value or 0


def _gate_up_words(g: GatedActivation) -> list[int] | None:
    if g._linear is not None or g._lib is None:  # not the fused float32 SiLU job
        return None
    b = g._blocks
    if b is not None:
        return [K_SILU_BLOCKS, 0, b.segs.data_ptr(), b.ptrs.data_ptr(), b.nseg, g._nb, int(b.tile_unit), 0]
    return [K_SILU_PANELS, g.weight.data_ptr(), 0, 0, 0, g._nb, 0, 0]


def _down_words(d: Linear) -> list[int] | None:
    if d.kind != "kernel" or d._amx or d.bias is not None:
        return None
    b = d._blocks
    if b is not None:
        return [K_BLOCKS, 0, b.segs.data_ptr(), b.ptrs.data_ptr(), b.nseg, d._nb, int(b.tile_unit), 0]
    if d.weight is None or d.weight.dtype != torch.float32:
        return None
    kind = K_F32_PAR if d._par is not None and d._nb >= 8 else K_F32
    return [kind, d.weight.data_ptr(), 0, 0, 0, d._nb, 0, 0]


class FusedExperts:
    """The block after its router, in one call: `fused(x, logits, residual, prompt_from)` is the Python block's
    output (layers/moe.py's `SparseMoE.__call__`) for rows x [T, H] of float32 and the router's logits [T, E]."""

    def __init__(self, lib: ctypes.CDLL, table: torch.Tensor, width: int, ldg: int, ldd: int) -> None:
        self.library, self.table, self.width, self._ldg, self._ldd = lib, table, width, ldg, ldd
        self.experts, self.top_k = int(table[0]), int(table[1])

    @classmethod
    def build(
        cls,
        router: Linear,
        experts: Sequence[tuple[GatedActivation, Linear]],
        top_k: int,
        normalize: bool,
        hidden: int,
        cache_dir: Path | None,
    ) -> FusedExperts | None:
        """The fused block over these projections (built by layers/moe.py), or None where some is not on the
        float32 kernels (or the kernel does not take this many experts)."""
        gemm = linear._lib
        lib = library(cache_dir) if gemm is not None and router.kind == "kernel" and not router._amx else None
        if lib is None:
            return None
        if len(experts) > lib.moe_max_experts() or not 0 < top_k <= min(len(experts), lib.moe_max_top_k()):
            return None
        words = [
            len(experts),
            top_k,
            int(normalize),
            _address(gemm, "gemm_silu_f32_par"),
            _address(gemm, "gemm_f32"),
            _address(gemm, "gemm_f32_par"),
            _address(gemm, "gemm_blocks_par"),
            _address(gemm, "gemm_grouped_par"),
        ]
        widths, ldgs, ldds = set(), set(), set()
        for gate_up, down in experts:
            g, d = _gate_up_words(gate_up), _down_words(down)
            if g is None or d is None or down.out_features != hidden:
                return None
            words += g + d
            widths.add(gate_up.out_features)
            ldgs.add(gate_up._nb // 2 * 16)
            ldds.add(down._nb * 16)
        if len(widths) != 1 or len(ldgs) != 1 or len(ldds) != 1:
            return None
        table = torch.tensor(words, dtype=torch.int64)
        return cls(lib, table, widths.pop(), ldgs.pop(), ldds.pop())

    def route(self, logits: torch.Tensor, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's k weights and experts as the fused call chooses them ([T, k] each, highest first)."""
        t = logits.shape[0]
        chosen = torch.empty(t, self.top_k, dtype=torch.int32)
        weights = torch.empty(t, self.top_k, dtype=torch.float32)
        self.library.moe_route_f32(
            logits.data_ptr(),
            logits.stride(0),
            t,
            self.experts,
            self.top_k,
            int(normalize),
            chosen.data_ptr(),
            weights.data_ptr(),
        )
        return weights, chosen.long()

    def __call__(
        self, x: torch.Tensor, logits: torch.Tensor, residual: torch.Tensor | None, prompt_from: int | None
    ) -> torch.Tensor:
        if x.stride(-1) != 1:
            x = x.contiguous()
        if residual is not None and residual.stride(-1) != 1:
            residual = residual.contiguous()
        t, h = x.shape
        pairs = t * self.top_k
        out = x.new_empty(t, h)
        scratch = x.new_empty(pairs * (h + self._ldg + self._ldd + 1))
        iscratch = torch.empty(3 * pairs + self.experts + 1, dtype=torch.int32)
        flags = (F_PINNED if linear.decode_rows_pinned() else 0) | (F_INT8 if linear.activations_int8() else 0)
        rc = self.library.moe_experts_f32(
            logits.data_ptr(),
            logits.stride(0),
            x.data_ptr(),
            x.stride(0),
            None if residual is None else residual.data_ptr(),
            0 if residual is None else residual.stride(0),
            out.data_ptr(),
            out.stride(0),
            t,
            h,
            self.width,
            self.table.data_ptr(),
            scratch.data_ptr(),
            iscratch.data_ptr(),
            self._ldg,
            self._ldd,
            t if prompt_from is None else prompt_from,
            flags,
        )
        if rc == -1:
            raise MemoryError("the MoE kernel's expert projections could not allocate their scratch")
        if rc:
            raise RuntimeError(f"the MoE kernel refused its table ({rc})")
        return out
