"""The GEMM kernels' modes: the tiles a shared GEMM is cut into, the tile unit (AMX) and when a step's rows take
it, and the calling thread's switches that keep decode rows on the register kernels or give GGUF blocks int8
activations (linear.py has the kernels' story). `TILE_UNIT` is read as `kernel_modes.TILE_UNIT` when weights are
packed (linear.py, packed_blocks.py), so tests and benches that turn the tile unit off set it here."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from engines.pytorch.gemm_library import _avx2, _load

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
TILE_UNIT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "MXFP4")  # csrc/gemm.c, amx_type
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


def _chunk(amx: int, m: int) -> int:
    """Column panels per tile of a shared GEMM of `m` rows (`amx`: the weight's tile-unit mode, 0 for none)."""
    return TILE_UNIT_FEW_ROWS_PANELS if amx in (TILE_MODE, BF16_TILES) and m <= TILE_UNIT_FEW_ROWS else CHUNK_PANELS
