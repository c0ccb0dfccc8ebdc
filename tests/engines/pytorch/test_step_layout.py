"""The rows of a step: decodes first whatever the batch's order, and the rows that sample in that same order."""

from __future__ import annotations

from engines.pytorch.step_layout import order_rows, row_order
from engines.types import SamplingParams, SequenceStep

GREEDY = SamplingParams(temperature=0.0)


def _step(seq: str, tokens: list[int], start: int, sample: bool = True, drafts: int = 0) -> SequenceStep:
    return SequenceStep(seq, tokens, start, [0, 1], sample, GREEDY, [1] * start + tokens, start, 0, drafts)


def test_decode_rows_come_first_and_sample_in_row_order() -> None:
    chunk = _step("chunk", [5, 6, 7], 0, sample=False)  # a non-final prefill chunk: no row samples
    prompt = _step("prompt", [8, 9], 0)
    verify = _step("verify", [3, 4, 4, 2], 10, drafts=3)
    decode = _step("decode", [7], 20)
    lay = order_rows([chunk, prompt, verify, decode])
    assert (
        [s.seq_id for s in lay.steps]
        == [s.seq_id for s in row_order([chunk, prompt, verify, decode])]
        == ["verify", "decode", "chunk", "prompt"]
    )
    assert lay.input_ids.tolist() == [3, 4, 4, 2, 7, 5, 6, 7, 8, 9]
    assert lay.positions.tolist() == [10, 11, 12, 13, 20, 0, 1, 2, 0, 1]
    assert lay.num_decode == 5
    # every verification row, the decode row, then the prompt's last row: ascending
    assert lay.sample_rows.tolist() == [0, 1, 2, 3, 4, 9]


def test_a_step_whose_every_row_samples_in_order_needs_no_index() -> None:
    lay = order_rows([_step("a", [1], 4), _step("b", [2, 3], 6, drafts=1)])
    assert lay.sample_rows is None and lay.num_decode == 3
