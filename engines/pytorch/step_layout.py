"""The rows of one step: which token each row holds, its position, which rows sample, and the index tables the
attention reads. Shared by the runner's forward pass and the `match_transformers` forward (exact_forward.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engines.pytorch.paged_attention import DecodeTables, PrefillRows
from engines.types import SequenceStep


@dataclass
class StepLayout:
    """Index tensors shared by every layer of one step. Rows are the decodes first, then the prefill chunks."""

    steps: list[SequenceStep]  # the batch in row order
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    sample_rows: torch.Tensor | None  # [S] rows (in T) whose logits are sampled; None: all rows, in order
    num_decode: int
    decode: DecodeTables | None = None
    # prefill rows (T - num_decode of them, P sequences)
    slots: torch.Tensor | None = None  # [T_p] cache slot each new token is written to (torch path)
    prefill: PrefillRows | None = None  # for the attention kernel; without it, the gather + SDPA tensors below
    kv_index: torch.Tensor | None = None  # [P, max_ctx] cache slots each sequence attends to
    mask: torch.Tensor | None = None  # [P, 1, max_q, max_ctx] True where attention is allowed
    q_index: torch.Tensor | None = None  # [T_p] row of each new token in the padded [P * max_q] query layout
    batch: int = 0
    max_q: int = 0


def order_rows(batch: Sequence[SequenceStep]) -> StepLayout:
    """The step's rows (decodes first), their tokens, positions and the rows that sample; no attention tables."""
    decodes = [s for s in batch if len(s.token_ids) == 1]
    ordered = decodes + [s for s in batch if len(s.token_ids) != 1]
    ids: list[int] = []
    positions: list[int] = []
    row_of: dict[int, int] = {}  # id(step) -> its last row
    for seq in ordered:
        ids.extend(seq.token_ids)
        positions.extend(range(seq.start_pos, seq.start_pos + len(seq.token_ids)))
        row_of[id(seq)] = len(ids) - 1
    sample_rows = [row_of[id(s)] for s in batch if s.sample]
    in_order = len(sample_rows) == len(ids) and sample_rows == list(range(len(ids)))
    return StepLayout(
        steps=ordered,
        input_ids=torch.tensor(ids, dtype=torch.long),
        positions=torch.tensor(positions, dtype=torch.long),
        sample_rows=None if in_order else torch.tensor(sample_rows, dtype=torch.long),
        num_decode=len(decodes),
    )
