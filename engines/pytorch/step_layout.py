"""The rows of one step: which token each row holds, its position, which rows sample, and the index tables the
attention reads. Shared by the runner's forward pass and the `match_transformers` forward (exact_forward.py).

A speculative verification step (`SequenceStep.num_draft_tokens` = k) is k + 1 decode rows, not a prefill chunk:
row j is the query at position start + j over the cache up to it, through the decode attention kernel like any
one-token decode, and every one of its rows samples. So each row's logits are the bits a one-token decode step of
that position computes (the dense layers' rows do not depend on the batch: linear.py), which is what keeps greedy
output under speculation token for token the same."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engines.pytorch.paged_attention import DecodeTables, PrefillRows
from engines.types import SequenceStep


@dataclass
class StepLayout:
    """Index tensors shared by every layer of one step. Rows are the decodes first, then the prefill chunks."""

    steps: list[SequenceStep]  # the batch in row order (row_order: decodes and verification steps first)
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    sample_rows: torch.Tensor | None  # [S] rows (in T, ascending) whose logits are sampled; None: all rows
    num_decode: int  # decode rows: one per decode step, k + 1 per verification step
    decode: DecodeTables | None = None
    # prefill rows (T - num_decode of them, P sequences)
    slots: torch.Tensor | None = None  # [T_p] cache slot each new token is written to (torch path)
    prefill: PrefillRows | None = None  # for the attention kernel; without it, the gather + SDPA tensors below
    kv_index: torch.Tensor | None = None  # [P, max_ctx] cache slots each sequence attends to
    mask: torch.Tensor | None = None  # [P, 1, max_q, max_ctx] True where attention is allowed
    q_index: torch.Tensor | None = None  # [T_p] row of each new token in the padded [P * max_q] query layout
    batch: int = 0
    max_q: int = 0


def is_decode(step: SequenceStep) -> bool:
    """Whether the step's rows are decode rows: one new token, or a verification step's last token and proposal."""
    return len(step.token_ids) == 1 or step.num_draft_tokens > 0


def row_order(batch: Sequence[SequenceStep]) -> list[SequenceStep]:
    """The batch in the order of its rows: decode and verification steps first, then prefill chunks, each part in
    the batch's order. The logits of a step come in this order too (decode rows first: the lm_head keeps them on
    the kernels of one-token steps, linear.py `prompt_from`)."""
    return [s for s in batch if is_decode(s)] + [s for s in batch if not is_decode(s)]


def order_rows(batch: Sequence[SequenceStep]) -> StepLayout:
    """The step's rows (row_order), their tokens, positions and the rows that sample (a verification step's k + 1
    rows, in order, for each such step); no attention tables."""
    ordered = row_order(batch)
    ids: list[int] = []
    positions: list[int] = []
    row_of: dict[int, int] = {}  # id(step) -> its last row
    for seq in ordered:
        ids.extend(seq.token_ids)
        positions.extend(range(seq.start_pos, seq.start_pos + len(seq.token_ids)))
        row_of[id(seq)] = len(ids) - 1
    sample_rows = [r for s in ordered if s.sample for r in range(row_of[id(s)] - s.num_draft_tokens, row_of[id(s)] + 1)]
    in_order = len(sample_rows) == len(ids) and sample_rows == list(range(len(ids)))
    return StepLayout(
        steps=ordered,
        input_ids=torch.tensor(ids, dtype=torch.long),
        positions=torch.tensor(positions, dtype=torch.long),
        sample_rows=None if in_order else torch.tensor(sample_rows, dtype=torch.long),
        num_decode=sum(len(s.token_ids) for s in ordered if is_decode(s)),
    )
