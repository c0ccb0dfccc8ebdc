"""The projections of a decoder layer, fused where a step gains from it: one weight for q/k/v and one for gate/up
(fewer, larger matmuls with the same dot products), from the checkpoint's separate weights (Llama's `q_proj`,
`k_proj`, `v_proj`) or its already fused ones (Phi-3's `qkv_proj`, `gate_up_proj`), and from GGUF blocks where the
loader kept a weight as blocks (gguf_blocks.py; such a weight is left on the meta device of transformers' model)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engines.pytorch.dense_ops import DenseOps
from engines.pytorch.gated_activation import GatedActivation
from engines.pytorch.gguf_blocks import GGUFBlocks, WeightBlocks
from engines.pytorch.linear import Linear
from engines.pytorch.native import HelperThreads


@dataclass(frozen=True)
class Kernels:
    """What every projection of a model is built with: the C kernels or torch ops, their cache folder, the helper
    threads and the norms' and activations' ops."""

    fast: bool
    cache_dir: Path | None
    helpers: HelperThreads | None
    dense: DenseOps

    def linear(
        self, weight: torch.Tensor | None, bias: torch.Tensor | None = None, blocks: WeightBlocks | None = None
    ) -> Linear:
        return Linear(weight, bias, self.fast, self.cache_dir, self.helpers, blocks)


def weight(module: Any) -> torch.Tensor | None:
    """A module's weight, or None where it exists only as GGUF blocks (left on the meta device by the loader)."""
    return None if module.weight.is_meta else module.weight


def _joined(blocks: dict[str, WeightBlocks], *names: str) -> WeightBlocks | None:
    """The blocks of a fused projection, if every part has them."""
    return GGUFBlocks.cat([blocks[n] for n in names]) if all(n in blocks for n in names) else None


def _part_weights(
    modules: tuple[Any, ...], names: tuple[str, ...], blocks: dict[str, WeightBlocks], fused_blocks: Any
) -> list[torch.Tensor] | None:
    """The float weights of a fused projection's parts, or None where the kernels read the fused blocks and some
    part exists only as blocks (no float copy is made). Where the fused weight has no blocks (some part lacks
    them), a part that exists only as blocks is expanded."""
    parts = [weight(m) for m in modules]
    if fused_blocks is not None and None in parts:
        return None
    return [blocks[n].dequantize() if w is None else w for n, w in zip(names, parts, strict=True)]


def linear_of(module: Any, name: str, blocks: dict[str, WeightBlocks], kernels: Kernels) -> Linear:
    """One projection as it is (`name`: its module name, the key of its blocks)."""
    return kernels.linear(weight(module), module.bias, blocks.get(name))


def qkv_projection(attn: Any, blocks: dict[str, WeightBlocks], kernels: Kernels) -> Linear:
    """q, k and v as one projection, its output [q | k | v] (with their biases where the family has them)."""
    if hasattr(attn, "qkv_proj"):  # fused in the checkpoint
        return linear_of(attn.qkv_proj, "qkv_proj", blocks, kernels)
    projs = (attn.q_proj, attn.k_proj, attn.v_proj)
    names = ("q_proj", "k_proj", "v_proj")
    fused_blocks = _joined(blocks, *names)
    parts = _part_weights(projs, names, blocks, fused_blocks)
    bias = torch.cat([p.bias for p in projs]).contiguous() if attn.q_proj.bias is not None else None
    return kernels.linear(torch.cat(parts) if parts is not None else None, bias, fused_blocks)


def gate_up_activation(mlp: Any, act: Any, blocks: dict[str, WeightBlocks], kernels: Kernels) -> GatedActivation:
    """act(x @ gate.T) * (x @ up.T) as one job (gated_activation.GatedActivation)."""
    if hasattr(mlp, "gate_up_proj"):  # fused in the checkpoint: [gate | up] along the output rows
        fused = mlp.gate_up_proj
        if fused.bias is not None:
            raise ValueError("MLP projections with bias are not supported by the native engine; use backend: vllm")
        n = fused.out_features // 2
        split = blocks.get("gate_up_proj")
        part_blocks = (split.rows(torch.arange(n)), split.rows(torch.arange(n, 2 * n))) if split is not None else None
        full = weight(fused)
        gate, up = (full[:n], full[n:]) if full is not None else (None, None)
        return GatedActivation(
            gate, up, act, kernels.fast, kernels.cache_dir, kernels.helpers, kernels.dense, part_blocks
        )
    if mlp.gate_proj.bias is not None:
        raise ValueError("MLP projections with bias are not supported by the native engine; use backend: vllm")
    part_blocks = (blocks["gate_proj"], blocks["up_proj"]) if "gate_proj" in blocks and "up_proj" in blocks else None
    gate, up = _part_weights((mlp.gate_proj, mlp.up_proj), ("gate_proj", "up_proj"), blocks, part_blocks) or (
        None,
        None,
    )
    return GatedActivation(gate, up, act, kernels.fast, kernels.cache_dir, kernels.helpers, kernels.dense, part_blocks)
