"""A gated MLP's input: act(x @ gate.T) * (x @ up.T), one fused kernel job where it can (float32, SiLU), else the
concatenated projection then the activation."""

from __future__ import annotations

from pathlib import Path

import torch

from engines.pytorch import host_memory
from engines.pytorch.dense_ops import DenseOps, _is_silu
from engines.pytorch.gemm_library import _avx2, _load
from engines.pytorch.gguf_blocks import GGUFBlocks, WeightBlocks
from engines.pytorch.kernel_modes import CHUNK_PANELS, ROW_TILE, _chunk
from engines.pytorch.linear import Linear
from engines.pytorch.native import HelperThreads
from engines.pytorch.packed_blocks import _pack_blocks


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
