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

Weights a GGUF file holds as quantized blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4; gguf_blocks.py)
or as float16 / bfloat16 in a float32 model are kept only in that form, repacked into panels (block_panels.py): no
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
rows where there are more than TILE_UNIT_MIN_ROWS of them (packed_blocks.py): x is split into three bfloat16
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

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from engines.interface import StepInputError
from engines.pytorch import host_memory, kernel_modes
from engines.pytorch.gemm_library import _avx2, _load
from engines.pytorch.gguf_blocks import WeightBlocks
from engines.pytorch.kernel_modes import BF16_TILES, CHUNK_PANELS, ROW_TILE, _chunk
from engines.pytorch.native import HelperThreads
from engines.pytorch.packed_blocks import _pack_blocks


class Linear:
    """`F.linear(x, weight, bias)` (+ an optional residual added to the result), on the fastest path available.

    `kind` is "kernel" (our packed GEMM), "onednn" (oneDNN with the weight packed once) or "torch". `weight` is
    the weight in the layout the kernel reads, or None where the kernel reads only GGUF blocks (`blocks_nbytes`)."""

    __slots__ = (
        "_amx",
        "_bias_padded",
        "_blocks",
        "_fn",
        "_lib",
        "_nb",
        "_par",
        "bias",
        "kind",
        "out_features",
        "weight",
    )

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
        self._lib: ctypes.CDLL | None = None  # gemm_library's, where kind is "kernel": read on every call
        self.weight = weight.contiguous()
        if not fast or weight.dtype not in (torch.float32, torch.bfloat16):
            return
        lib = _load(cache_dir) if _avx2() else None
        if lib is not None:
            if blocks is not None and weight.dtype == torch.float32 and self._take_blocks(lib, blocks, bias, helpers):
                return
            n, k = weight.shape
            nb = self._nb = (n + 15) // 16
            if weight.dtype == torch.bfloat16 and k % 32 == 0 and kernel_modes.TILE_UNIT and lib.amx_supported():
                self._amx = BF16_TILES
            if n % 16:
                weight = torch.cat((weight, weight.new_zeros(nb * 16 - n, k)))
            if self._amx == BF16_TILES:
                self.weight = host_memory.copy(_bf16_tiles(weight, nb))
            else:
                self.weight = host_memory.copy(weight.view(nb, 16, k).transpose(1, 2))  # [NB, K, 16]
            self._pad_bias(weight.dtype)
            self.kind, self._lib = "kernel", lib
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
        self.out_features, self._nb, self.kind, self.weight, self._lib = n, nb, "kernel", None, lib
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
        self._lib.blocks_rows(
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
                self._lib.gemm_bf16_amx_par(
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
                b.gemm(self._lib, x, y, nb, prompt_from, bias, residual)
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


def _bf16_tiles(weight: torch.Tensor, nb: int) -> torch.Tensor:
    """bfloat16 [NB * 16, K] in the tile unit's layout for bf16_amx_rows: per group of 4 panels (fewer in the last),
    [K / 32][panels][16 k pairs][16 columns][2]."""
    panels = weight.view(nb, 16, weight.shape[1] // 32, 16, 2).permute(0, 2, 3, 1, 4)  # [NB, K / 32, 16, 16, 2]
    return torch.cat([panels[n : n + 4].transpose(0, 1).reshape(-1) for n in range(0, nb, 4)])
