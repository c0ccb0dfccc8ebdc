"""gpt-oss's expert activation: a SwiGLU with clamps, on one biased projection of gate and up.

transformers' `GptOssExperts._apply_gate`: gate clamped from above at `limit`, up clamped to [-limit, limit], then
`(up + 1) * (gate * sigmoid(alpha * gate))` (alpha 1.702, limit 7.0 in the released models). The checkpoint holds
gate and up interleaved along the output (`gate_up_proj[..., 0::2]` is gate); the projection here holds them
de-interleaved, [gate | up], so the activation reads two halves. Here the clamps and the sigmoid are torch ops after
the projection's kernel: what bfloat16 models and torch's projections run, and what the MoE block's fused C call
(moe_experts.py, csrc/moe.c's clamped_swiglu: the same ops in C, its exp within a few ulp of torch's) is checked
against."""

from __future__ import annotations

import torch

from engines.pytorch.linear import Linear


class ClampedSwiGLU:
    """`(clamp(up) + 1) * swish_alpha(clamp(gate))` of `linear(x)` = [gate | up] (`linear` carries the biases)."""

    def __init__(self, linear: Linear, alpha: float, limit: float) -> None:
        self._linear, self.alpha, self.limit = linear, float(alpha), float(limit)
        self.out_features = linear.out_features // 2

    @property
    def on_tile_unit(self) -> bool:
        """As `Linear.on_tile_unit`."""
        return self._linear.on_tile_unit

    @property
    def exact_rows(self) -> bool:
        """As `Linear.exact_rows` (the activation is elementwise)."""
        return self._linear.exact_rows

    @property
    def blocks_nbytes(self) -> int:
        """As `Linear.blocks_nbytes`."""
        return self._linear.blocks_nbytes

    @property
    def weight(self) -> torch.Tensor | None:
        """As `Linear.weight` (None where the projection holds GGUF blocks only)."""
        return self._linear.weight

    def __call__(self, x: torch.Tensor, prompt_from: int | None = None) -> torch.Tensor:
        """The activation of rows x [T, H]: [T, intermediate]; `prompt_from` as for `Linear`."""
        gate, up = self._linear(x, prompt_from=prompt_from).chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))
