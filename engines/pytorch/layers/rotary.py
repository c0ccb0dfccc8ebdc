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


class Rotary:
    """Rotary tables [T, head_dim] for a step's rows."""

    def __init__(self, module: Any, config: Any) -> None:
        self._module = module
        rope_type = getattr(module, "rope_type", "default")
        self.layer_types: list[str | None] = (sorted(rope_type) if isinstance(rope_type, dict) else [None])
        params = getattr(config, "rope_parameters", None) or {}
        self._long_after = (params.get("original_max_position_embeddings")
                            or getattr(config, "original_max_position_embeddings", None)) \
            if rope_type == "longrope" else None

    def _table(self, like: torch.Tensor, positions: torch.Tensor, layer_type: str | None
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
            tables[layer_type] = (cos, fold_sin(sin))
        return tables

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
