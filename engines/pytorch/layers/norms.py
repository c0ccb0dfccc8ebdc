"""RMSNorm as a decoder layer holds it.

The C kernel (dense_ops.DenseOps.rms_norm) computes x * rsqrt(mean(x^2) + eps) * w with transformers' order of sums,
so any RMSNorm whose scale is w (Llama's and most others') or 1 + w (Gemma's, with 1 + w computed once here in the
weight's dtype as Gemma computes it in float32) runs on it with transformers' bits. Where the kernel does not run
(torch ops, another dtype), `__call__` is transformers' own module: the same bits as the model's forward.
"""

from __future__ import annotations

from typing import Any

import torch


class RMSNorm:
    """`weight`: the scale the kernel multiplies by; `variance_epsilon`: eps; calling it runs transformers' module."""

    def __init__(self, module: Any, unit_offset: bool = False) -> None:
        """`module`: transformers' norm (its parameters are copied: weights loaded from safetensors are views of the
        file's mapping, which would otherwise stay resident); `unit_offset`: the scale is 1 + weight (Gemma)."""
        for param in module.parameters():
            param.data = param.data.clone()
        self._module = module
        self.variance_epsilon = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))
        weight = module.weight.detach()
        # Gemma scales by (1 + w.float()): a float32 scale, so a bfloat16 model's rows go to the module (the kernel
        # takes the scale in the rows' dtype), and a float32 model's to the kernel with the same product
        self.weight = 1.0 + weight.float() if unit_offset else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._module(x)


def rms_norm(module: Any | None, unit_offset: bool = False) -> RMSNorm | None:
    """The layer's RMSNorm of transformers' `module` (None where the family has none there)."""
    return None if module is None else RMSNorm(module, unit_offset)
