"""The MLP slot of a decoder layer.

`MLP` is the contract: rows in, (residual +) the MLP's output out, with the projections it holds for the step
replay's recorder and the weight accounting. `GatedMLP` (down(act(gate(x)) * up(x)): SiLU for Llama-likes, GELU-tanh
for Gemma) fills it for dense families; a mixture-of-experts block (router, experts) fills the same slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from engines.pytorch.gated_activation import GatedActivation
from engines.pytorch.linear import Linear


class MLP(Protocol):
    """A decoder layer's feed-forward block."""

    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, prompt_from: int | None = None
    ) -> torch.Tensor:
        """(residual +) the block's output for rows x [T, hidden]; `prompt_from`: where the step's prompt rows
        start (the decode rows before them stay on one-token kernels, linear.Linear)."""
        ...

    def projections(self) -> list[Any]:
        """Every `Linear`/`GatedActivation` it calls (the step replay records their entry points)."""
        ...


@dataclass
class GatedMLP:
    gate_up_act: GatedActivation
    down: Linear

    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, prompt_from: int | None = None
    ) -> torch.Tensor:
        return self.down(self.gate_up_act(x, prompt_from=prompt_from), residual, prompt_from=prompt_from)

    def projections(self) -> list[Any]:
        return [self.gate_up_act, self.down]
