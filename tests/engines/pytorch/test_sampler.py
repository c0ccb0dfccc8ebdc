"""The native engine's sampler: a row that cannot be sampled fails alone; tiny temperatures are greedy."""

from __future__ import annotations

import torch

from engines.pytorch.sampler import sample
from engines.types import SamplingParams, SequenceStep


def _step(seq_id: str, **sampling: object) -> SequenceStep:
    return SequenceStep(seq_id, [1], 0, [0], True, SamplingParams(**sampling), [1], 1, 0)  # type: ignore[arg-type]


def _logits(rows: int, vocab: int = 50) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))


def test_temperatures_below_1e_5_are_greedy() -> None:
    logits = _logits(3)
    steps = [_step("a", temperature=1e-40), _step("b", temperature=9e-6, seed=3), _step("c", temperature=0.0)]
    result = sample(logits.clone(), steps, [0], {})
    assert not result.errors
    assert [result.token_ids[s] for s in "abc"] == logits.argmax(dim=-1).tolist()
    assert SamplingParams(temperature=1e-5).greedy is False


def test_non_finite_logits_fail_their_row_alone() -> None:
    logits = _logits(4)
    expected = logits.argmax(dim=-1).tolist()
    logits[1, 7] = float("nan")
    logits[2, 3] = float("inf")
    steps = [_step(x, temperature=0.0) for x in "abcd"]  # all plain greedy: the batched fast path is not taken
    result = sample(logits, steps, [0], {})
    assert set(result.errors) == {"b", "c"}
    assert "non-finite logits" in result.errors["b"]
    assert (result.token_ids["a"], result.token_ids["d"]) == (expected[0], expected[3])


class _BrokenConstraint:
    def allowed_mask(self, vocab_size: int) -> torch.Tensor:
        raise RuntimeError("matcher crashed")

    def accept(self, token_id: int) -> None:
        pass


class _NothingAllowed:
    def allowed_mask(self, vocab_size: int) -> torch.Tensor:
        return torch.zeros(vocab_size, dtype=torch.bool)

    def accept(self, token_id: int) -> None:
        pass


def test_a_failing_logits_processor_or_empty_mask_fails_its_row_alone() -> None:
    logits = _logits(4)
    seeded = [torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)]
    alone = sample(logits[3:].clone(), [_step("d", temperature=0.8, seed=5)], [0], {"d": seeded[0]})
    steps = [_step("a", temperature=0.0, logprobs=2), _step("b", constraint=_BrokenConstraint()),
             _step("c", temperature=0.0, constraint=_NothingAllowed()), _step("d", temperature=0.8, seed=5)]
    result = sample(logits.clone(), steps, [0], {"d": seeded[1]})
    assert set(result.errors) == {"b", "c"}
    assert "RuntimeError" in result.errors["b"] and "no token can be sampled" in result.errors["c"]
    assert result.token_ids["a"] == int(logits[0].argmax()) and len(result.logprobs["a"].top) == 2
    assert result.token_ids["d"] == alone.token_ids["d"]  # the seeded row draws as it does alone
