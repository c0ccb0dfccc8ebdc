"""The rotary tables of a step, as transformers computes them.

transformers' rotary module of the model (kept from the loaded model: its inverse frequencies and attention scaling
are what the config's `rope_parameters` make of default, linear, llama3, yarn and LongRoPE scaling) gives cos and
sin of the step's positions, so the tables are transformers' bits. Two things differ from one forward of
transformers:
- models with a table per layer type (Gemma 3: local and global RoPE) get one table each, keyed by layer type;
- LongRoPE switches to its long factors when the call's longest sequence passes `original_max_position_embeddings`:
  transformers decides once per forward, for all rows, from the largest position id. A step here mixes sequences,
  so each row gets the table transformers' own call for that row would use: a prompt row the whole prompt's
  (generate's prefill is one call), a decode row its own position's.
"""

from __future__ import annotations

from typing import Any

import torch

from engines.pytorch.step_layout import StepLayout

Tables = dict[str | None, tuple[torch.Tensor, torch.Tensor]]  # layer type (None: the model's one) -> (cos, sin)


def fold_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with rotate_half's sign folded in (see paged_attention.rotate)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def partial_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """Where each of a head's dimensions goes when only the first `rotary_dim` rotate (partial rotary: Phi-4-mini):
    transformers rotates pairs (i, i + rotary_dim / 2) of them and passes the rest. Reordered as [rotated first
    half, passed first half, rotated second half, passed second half], the rotated pairs are (i, i + head_dim / 2)
    as in a full rotation, and the passed dimensions pair with each other under cos 1 and sin 0 (x * 1 + y * 0 = x
    exactly), so the kernels' full-width rotation computes transformers' partial one. q and k are reordered alike
    (their dot products are the same sums); v is not. Returns new -> old dimension."""
    r, p = rotary_dim // 2, (head_dim - rotary_dim) // 2
    return torch.cat(
        (torch.arange(r), rotary_dim + torch.arange(p), r + torch.arange(r), rotary_dim + p + torch.arange(p))
    )


class Rotary:
    """Rotary tables [T, head_dim] for a step's rows."""

    def __init__(self, module: Any, config: Any, head_dim: int | None = None) -> None:
        """`head_dim`: where transformers' tables are narrower (partial rotary), they are widened to it in
        `partial_order`'s order with cos 1 and sin 0 for the passed dimensions."""
        self._module = module
        self._head_dim = head_dim
        rope_type = getattr(module, "rope_type", "default")
        self.layer_types: list[str | None] = sorted(rope_type) if isinstance(rope_type, dict) else [None]
        params = getattr(config, "rope_parameters", None) or {}
        self._long_after = (
            (
                params.get("original_max_position_embeddings")
                or getattr(config, "original_max_position_embeddings", None)
            )
            if rope_type == "longrope"
            else None
        )

    def _table(
        self, like: torch.Tensor, positions: torch.Tensor, layer_type: str | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        args = (like[None], positions[None]) + (() if layer_type is None else (layer_type,))
        cos, sin = self._module(*args)
        return cos[0], sin[0]

    def __call__(self, like: torch.Tensor, lay: StepLayout) -> Tables:
        """cos and folded sin of every row of the step, per layer type (`like`: a tensor of the rows' dtype)."""
        tables = {}
        for layer_type in self.layer_types:
            if self._long_after is None:
                cos, sin = self._table(like, lay.positions, layer_type)
            else:
                cos, sin = self._longrope(like, lay)
            if self._head_dim is not None and cos.shape[-1] < self._head_dim:
                cos, sin = self._widen(cos, 1.0), self._widen(sin, 0.0)
            tables[layer_type] = (cos, fold_sin(sin))
        return tables

    def _widen(self, table: torch.Tensor, passed: float) -> torch.Tensor:
        half, pad = table.shape[-1] // 2, (self._head_dim - table.shape[-1]) // 2
        fill = table.new_full((table.shape[0], pad), passed)
        return torch.cat((table[:, :half], fill, table[:, half:], fill), dim=-1)

    def width(self) -> int:
        """The dimensions transformers' tables rotate (of the first layer type)."""
        cos, _ = self._table(torch.zeros(1, 1), torch.zeros(1, dtype=torch.long), self.layer_types[0])
        return cos.shape[-1]

    def _longrope(self, like: torch.Tensor, lay: StepLayout) -> tuple[torch.Tensor, torch.Tensor]:
        """Short-factor rows from a call whose positions all lie within the original length, long-factor rows
        from one that reaches past it (the module picks the factors from the call's largest position)."""
        lengths = []  # per row: the sequence length of transformers' call that computes the row
        for seq in lay.steps:
            for p in range(seq.start_pos, seq.start_pos + len(seq.token_ids)):
                lengths.append(max(p + 1, seq.num_prompt_tokens) if p < seq.num_prompt_tokens else p + 1)
        long_rows = torch.tensor(lengths) > self._long_after
        if not bool(long_rows.any()):
            return self._table(like, lay.positions, None)
        # one extra position at the original length makes the module take its long factors; its row is dropped
        reach = torch.cat((lay.positions, torch.tensor([self._long_after], dtype=lay.positions.dtype)))
        cos_long, sin_long = self._table(like, reach, None)
        cos_long, sin_long = cos_long[:-1], sin_long[:-1]
        if bool(long_rows.all()):
            return cos_long, sin_long
        short = lay.positions.clamp(max=self._long_after - 1)  # rows past it are taken from the long table
        cos, sin = self._table(like, short, None)
        pick = long_rows[:, None]
        return torch.where(pick, cos_long, cos), torch.where(pick, sin_long, sin)
