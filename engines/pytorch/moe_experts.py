"""A sparse MoE block's routing, experts and combination in one C call (csrc/moe.c), so that an MoE model's decode
steps are kernel calls only and the step replay (step_replay.py) replays them.

Why: routing (softmax, top-k, the weights) and grouping a step's rows by expert are data-dependent torch ops in the
Python block (layers/moe.py); the replay refuses any torch op that computes, so every decode step of an MoE model
ran from Python. Here the router's projection stays a recorded `Linear` call and everything after it is one call
of `moe_experts_f32`, which routes each row from the router's logits (transformers' order: softmax in float32,
torch.topk's choice among ties, the k weights divided by their sum where the family normalises; or gpt-oss's
torch.topk of the logits, then a softmax of those k), runs each chosen expert once over the rows that chose it on
csrc/gemm.c's kernels (the same jobs as the experts' own `GatedActivation` / `ClampedSwiGLU` and `Linear`: their
packed float32 panels or GGUF blocks, read in place, their biases added; gpt-oss's clamped SwiGLU in C between the
two projections; experts no row chose are not read), and adds the weighted sum, slot by slot, to the residual. The
replay records that call with the step's buffers; which experts run is decided inside it, step by step.

Taken where every projection of the block is on the float32 kernels (the experts' gate-up the fused SiLU job, or a
projection of [gate | up] before the clamped SwiGLU; the down projections packed float32 panels or GGUF blocks);
otherwise (bfloat16, torch's projections, another activation) the block stays the Python one.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from pathlib import Path

import torch

from engines.pytorch import gemm_library
from engines.pytorch.gated_activation import GatedActivation
from engines.pytorch.kernel_modes import activations_int8, decode_rows_pinned
from engines.pytorch.layers.swiglu import ClampedSwiGLU
from engines.pytorch.linear import Linear
from engines.pytorch.native import Signatures, load_library

_p, _i64, _i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# csrc/moe.c
SIGNATURES: Signatures = {
    "moe_max_experts": (_i32, []),
    "moe_max_top_k": (_i32, []),
    # logits, ldl, M, E, k, rule (R_*), chosen, weights
    "moe_route_f32": (_i32, [_p, _i64, _i32, _i32, _i32, _i32, _p, _p]),
    # logits, ldl, x, ldx, residual, ldr, out, ldo, M, H, I, table, scratch, iscratch, ldg, ldd, prompt_from, flags
    "moe_experts_f32": (
        _i32,
        [_p, _i64, _p, _i64, _p, _i64, _p, _i64, _i32, _i32, _i32, _p, _p, _p, _i64, _i64, _i32, _i32],
    ),
}
# the table's layout (csrc/moe.c)
T_GROUPED, T_HEADER, P_WORDS = 7, 11, 8
K_SILU_PANELS, K_SILU_BLOCKS, K_F32, K_F32_PAR, K_BLOCKS = range(5)
R_SOFTMAX_TOP, R_SOFTMAX_TOP_NORMALIZE, R_TOP_SOFTMAX = range(3)  # routing rules
A_SILU, A_CLAMPED_SWIGLU = range(2)  # activations
F_PINNED, F_INT8 = 1, 2


def library(cache_dir: Path | None) -> ctypes.CDLL | None:
    """csrc/moe.c, built for this CPU (None without a compiler)."""
    return load_library("moe", cache_dir, SIGNATURES)


def _address(lib: ctypes.CDLL, name: str) -> int:
    # lib[name] is a fresh function object: its address even while a recorder has wrapped the attribute
    return ctypes.cast(lib[name], ctypes.c_void_p).value or 0


def _float_word(value: float) -> int:
    """A float32's bits as a table word (csrc/moe.c's word_float)."""
    return int(struct.unpack("<I", struct.pack("<f", value))[0])


def _silu_words(g: GatedActivation) -> list[int] | None:
    if g._linear is not None or g._lib is None:  # not the fused float32 SiLU job
        return None
    b = g._blocks
    if b is not None:
        return [K_SILU_BLOCKS, 0, b.segs.data_ptr(), b.ptrs.data_ptr(), b.nseg, g._nb, int(b.tile_unit), 0]
    return [K_SILU_PANELS, g.weight.data_ptr(), 0, 0, 0, g._nb, 0, 0]


def _linear_words(d: Linear) -> list[int] | None:
    """A float32 projection on the kernels (a down projection, or the [gate | up] one before a clamped SwiGLU),
    its padded bias where it has one."""
    if d.kind != "kernel" or d._amx:
        return None
    bias = d._bias_padded.data_ptr() if d._bias_padded is not None else 0
    b = d._blocks
    if b is not None:
        return [K_BLOCKS, 0, b.segs.data_ptr(), b.ptrs.data_ptr(), b.nseg, d._nb, int(b.tile_unit), bias]
    if d.weight is None or d.weight.dtype != torch.float32:
        return None
    kind = K_F32_PAR if d._par is not None and d._nb >= 8 else K_F32
    return [kind, d.weight.data_ptr(), 0, 0, 0, d._nb, 0, bias]


def _gate_up_words(g: GatedActivation | ClampedSwiGLU) -> tuple[list[int], int] | None:
    """The expert's gate-up words and the gate-up output's row stride (its panels' columns)."""
    if isinstance(g, ClampedSwiGLU):
        words = _linear_words(g._linear)
        return None if words is None else (words, g._linear._nb * 16)
    words = _silu_words(g)
    return None if words is None else (words, g._nb // 2 * 16)


class FusedExperts:
    """The block after its router, in one call: `fused(x, logits, residual, prompt_from)` is the Python block's
    output (layers/moe.py's `SparseMoE.__call__`) for rows x [T, H] of float32 and the router's logits [T, E]."""

    def __init__(self, lib: ctypes.CDLL, table: torch.Tensor, width: int, ldg: int, ldd: int) -> None:
        self.library, self.table, self.width, self._ldg, self._ldd = lib, table, width, ldg, ldd
        self.experts, self.top_k, self.rule = int(table[0]), int(table[1]), int(table[2])

    @classmethod
    def build(
        cls,
        router: Linear,
        experts: Sequence[tuple[GatedActivation | ClampedSwiGLU, Linear]],
        top_k: int,
        normalize: bool,
        hidden: int,
        cache_dir: Path | None,
        softmax_of_top: bool = False,
    ) -> FusedExperts | None:
        """The fused block over these projections (built by layers/moe.py, models/gpt_oss.py), or None where some
        is not on the float32 kernels, the experts' activations differ (or their clamps), or the kernel does not
        take this many experts. `softmax_of_top`: gpt-oss's routing (the softmax of the top-k logits;
        `normalize` is then not read)."""
        gemm = gemm_library._lib
        lib = library(cache_dir) if gemm is not None and router.kind == "kernel" and not router._amx else None
        if lib is None:
            return None
        if len(experts) > lib.moe_max_experts() or not 0 < top_k <= min(len(experts), lib.moe_max_top_k()):
            return None
        # the activation (and gpt-oss's clamps), one for every expert
        acts = {(g.alpha, g.limit) if isinstance(g, ClampedSwiGLU) else None for g, _ in experts}
        if len(acts) != 1:
            return None
        clamps = acts.pop()
        alpha, limit = clamps if clamps is not None else (0.0, 0.0)
        words = [
            len(experts),
            top_k,
            R_TOP_SOFTMAX if softmax_of_top else R_SOFTMAX_TOP_NORMALIZE if normalize else R_SOFTMAX_TOP,
            _address(gemm, "gemm_silu_f32_par"),
            _address(gemm, "gemm_f32"),
            _address(gemm, "gemm_f32_par"),
            _address(gemm, "gemm_blocks_par"),
            _address(gemm, "gemm_grouped_par"),
            A_SILU if clamps is None else A_CLAMPED_SWIGLU,
            _float_word(alpha),
            _float_word(limit),
        ]
        widths, ldgs, ldds = set(), set(), set()
        for gate_up, down in experts:
            g, d = _gate_up_words(gate_up), _linear_words(down)
            if g is None or d is None or down.out_features != hidden:
                return None
            words += g[0] + d
            widths.add(gate_up.out_features)
            ldgs.add(g[1])
            ldds.add(down._nb * 16)
        if len(widths) != 1 or len(ldgs) != 1 or len(ldds) != 1:
            return None
        table = torch.tensor(words, dtype=torch.int64)
        return cls(lib, table, widths.pop(), ldgs.pop(), ldds.pop())

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
            self.rule,
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
        flags = (F_PINNED if decode_rows_pinned() else 0) | (F_INT8 if activations_int8() else 0)
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
