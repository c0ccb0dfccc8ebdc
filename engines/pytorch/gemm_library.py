"""The library of csrc/gemm.c (projections, norms, activations): its entry points' ctypes signatures and its
load (built by native.py on first use), one for Linear, DenseOps and GatedActivation. `_lib` is the loaded one:
the step replay records its calls (step_replay.py), and tests set it to None to load a build for another target."""

from __future__ import annotations

import ctypes
from pathlib import Path

from engines.pytorch.native import Signatures, load_library

_lib: ctypes.CDLL | None = None


def _signatures() -> Signatures:
    """csrc/gemm.c's entry points."""
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    gemm_f32 = [p, i64, p, p, p, i64, p, i64, i32, i32, i32]  # x, ldx, wp, bias, residual, ldr, y, ldy, M, NB, K
    gemm_bf16w = [p, i64, p, p, p, i64, p, p, i64, i32, i32, i32]  # ... the float32 accumulator, then y ...
    tiles = [i32, i32]  # chunk, mchunk
    silu = [p, i64, p, i64, i32, i32]  # gu, ldg, y, ldy, M, I
    rms = [p, i64, p, f32, p, i64, i32, i32]  # x, ldx, w, eps, y, ldy, M, H
    rms_add = [p, i64, p, f32, p, i64, p, i64, i32, i32]  # x, ldx, w, eps, r, ldr, y, ldy, M, H
    rms_heads = [p, i64, p, f32, p, i64, i32, i32, i32]  # x, ldx, w, eps, y, ldy, M, heads, D
    softcap = [p, i64, f32, i32, i32]  # x (in place), ldx, cap, M, N (div_f32: the divisor for cap)
    scale_add = [p, i64, f32, p, i64, p, i64, i32, i32]  # x, ldx, s, r, ldr, y, ldy, M, N
    return {
        "set_pool": (None, [p]),
        "gemm_f32": (None, gemm_f32),
        "gemm_bf16w": (None, gemm_bf16w),
        "gemm_f32_par": (None, [*gemm_f32, *tiles]),
        "gemm_bf16w_par": (None, [*gemm_bf16w, *tiles]),
        # x, ldx, segments (end panel, type), their panels' addresses, count, bias, residual, ldr, y, ldy, M, NB, K
        "gemm_blocks_par": (i32, [p, i64, p, p, i32, p, p, i64, p, i64, i32, i32, i32, *tiles, i32]),  # + amx
        "gemm_bf16_amx_par": (i32, [*gemm_f32, *tiles]),
        "gemm_silu_f32_par": (i32, [p, i64, p, p, p, i32, p, i64, i32, i32, i32, *tiles, i32]),  # x, ldx, wp, segments
        "blocks_rows": (None, [p, p, i32, i32, p, i32, p]),  # segments, ptrs, count, K, rows, T, out
        "amx_supported": (i32, []),
        "int8_supported": (i32, []),
        "exact_silu_bf16": (i32, []),
        "silu_mul_f32": (None, [*silu, p]),  # + the row counter (NULL: all rows)
        "silu_mul_f32_par": (None, silu),
        "silu_mul_bf16": (None, [*silu, p]),
        "silu_mul_bf16_par": (None, silu),
        "rms_norm_f32": (None, [*rms, p]),
        "rms_norm_f32_par": (None, rms),
        "rms_norm_bf16": (None, [*rms, p]),
        "rms_norm_bf16_par": (None, rms),
        "rms_norm_add_f32": (None, [*rms_add, p]),
        "rms_norm_add_f32_par": (None, rms_add),
        "rms_norm_heads_f32": (None, [*rms_heads, p]),
        "rms_norm_heads_f32_par": (None, rms_heads),
        "gelu_tanh_mul_f32": (None, [*silu, p]),
        "gelu_tanh_mul_f32_par": (None, silu),
        "softcap_f32": (None, [*softcap, p]),
        "softcap_f32_par": (None, softcap),
        "scale_add_f32": (None, [*scale_add, p]),
        "scale_add_f32_par": (None, scale_add),
        "div_f32": (None, [*softcap, p]),
        "div_f32_par": (None, softcap),
    }


_SIGNATURES = _signatures()


def _load(cache_dir: Path | None) -> ctypes.CDLL | None:
    global _lib
    if _lib is None:
        _lib = load_library("gemm", cache_dir, _SIGNATURES)
    return _lib


def _avx2() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    return " avx2" in flags and " fma" in flags
