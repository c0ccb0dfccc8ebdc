"""The native engine's sampler: a row that cannot be sampled fails alone; tiny temperatures are greedy."""

from __future__ import annotations

import torch

from engines.pytorch.sampler import greedy_result, sample
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
    steps = [
        _step("a", temperature=0.0, logprobs=2),
        _step("b", constraint=_BrokenConstraint()),
        _step("c", temperature=0.0, constraint=_NothingAllowed()),
        _step("d", temperature=0.8, seed=5),
    ]
    result = sample(logits.clone(), steps, [0], {"d": seeded[1]})
    assert set(result.errors) == {"b", "c"}
    assert "RuntimeError" in result.errors["b"] and "no token can be sampled" in result.errors["c"]
    assert result.token_ids["a"] == int(logits[0].argmax()) and len(result.logprobs["a"].top) == 2
    assert result.token_ids["d"] == alone.token_ids["d"]  # the seeded row draws as it does alone


# -- speculative verification (one-hot proposals) ---------------------------------------------------------------
VOCAB_LOGITS = torch.tensor(
    [
        [1.0, 0.2, 0.8, -0.5, 0.6, -2.0],  # after the history
        [0.1, 1.2, -0.3, 0.9, 0.4, 0.0],  # after the history and the first proposed token
        [0.5, -0.2, 1.1, 0.3, -1.0, 0.7],
    ]
)  # after both proposed tokens
DRAFTS = [1, 3]
SPEC_SAMPLING = {"temperature": 0.8, "top_k": 5, "frequency_penalty": 0.7}
TRIALS = 6000


def _verify_step(**sampling: object) -> SequenceStep:
    # prompt [5], one output token so far (4); the step carries the last token and the two proposed ones
    return SequenceStep(
        "v",
        [4, *DRAFTS],
        2,
        [0],
        True,
        SamplingParams(**sampling),
        [5, 4],
        1,
        1,  # type: ignore[arg-type]
        num_draft_tokens=len(DRAFTS),
    )


def _plain_distribution(row: int, outputs: list[int]) -> torch.Tensor:
    """What plain sampling draws from at that position, written out: frequency penalty over the output so far,
    temperature, top-k."""
    logits = (
        VOCAB_LOGITS[row]
        - SPEC_SAMPLING["frequency_penalty"] * torch.bincount(torch.tensor(outputs), minlength=6).float()
    )
    logits = logits / SPEC_SAMPLING["temperature"]
    logits[logits < torch.topk(logits, SPEC_SAMPLING["top_k"]).values[-1]] = float("-inf")
    return torch.softmax(logits.double(), dim=-1)


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    from scipy.stats import chisquare

    keep = probs > 0
    assert int(counts[~keep].sum()) == 0, "a token plain sampling cannot draw was drawn"
    return float(chisquare(counts[keep].numpy(), (probs[keep] * counts.sum()).numpy()).pvalue)


def test_verification_samples_each_position_from_the_plain_distribution() -> None:
    """The rejection rule keeps the distribution: the first emitted token follows p_0; given that the first
    proposed token was accepted, the next follows p_1 (the penalty counting that token); given both, the bonus token
    follows p_2. Chi-square over TRIALS seeded verifications, each at p > 1e-4 -- while a rule that drew the token
    after a rejection from p unchanged (not from p without the rejected token) is refused at p < 1e-9."""
    step = _verify_step(**SPEC_SAMPLING)
    gen = torch.Generator().manual_seed(1234)
    first, second, bonus = torch.zeros(6), torch.zeros(6), torch.zeros(6)
    for _ in range(TRIALS):
        result = sample(VOCAB_LOGITS.clone(), [step], [0], {"v": gen})
        emitted = [*DRAFTS[: result.num_accepted["v"]], result.token_ids["v"]]
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
        if len(emitted) > 2:
            bonus[emitted[2]] += 1
    d0, d1 = DRAFTS
    p0, p1, p2 = _plain_distribution(0, [4]), _plain_distribution(1, [4, d0]), _plain_distribution(2, [4, d0, d1])
    assert _chi2_pvalue(first, p0) > 1e-4
    assert _chi2_pvalue(second, p1) > 1e-4 and second.sum() > TRIALS * p0[d0] * 0.9
    assert _chi2_pvalue(bonus, p2) > 1e-4 and bonus.sum() > 0.9 * TRIALS * p0[d0] * p1[d1]
    wrong = p0 * (1 - p0[d0])  # resampled from p with the rejected token kept in
    wrong[d0] += p0[d0]
    assert _chi2_pvalue(first, wrong) < 1e-9
    # ... and a rule that ignored the proposed prefix in the penalties draws the second token from another p
    assert _chi2_pvalue(second, _plain_distribution(1, [4])) < 1e-9


def test_greedy_verification_accepts_while_the_argmax_agrees() -> None:
    logits = VOCAB_LOGITS.clone()
    for drafts, accepted, token in (([0, 1], 2, 2), ([0, 4], 1, 1), ([3, 1], 0, 0)):
        step = SequenceStep(
            "g", [4, *drafts], 2, [0], True, SamplingParams(temperature=0), [5, 4], 1, 1, num_draft_tokens=2
        )
        plain = sample(logits.clone(), [step], [0], {})  # every row plain greedy: one batched argmax
        assert (plain.num_accepted["g"], plain.token_ids["g"]) == (accepted, token)
        step.sampling = SamplingParams(temperature=0, min_tokens=1, logit_bias={5: -1.0})  # per-row processing
        edited = sample(logits.clone(), [step], [0], {})
        assert (edited.num_accepted["g"], edited.token_ids["g"]) == (accepted, token)


def test_greedy_verification_applies_min_tokens_per_position() -> None:
    """min_tokens bans EOS (0) until the output is long enough: at each proposed position, counting the proposed
    prefix, as plain steps would."""
    logits = torch.full((3, 6), -1.0)
    logits[:, 0] = 5.0  # EOS is every row's argmax
    logits[0, 2] = logits[1, 3] = 4.0  # the runner-up tokens: the proposal
    step = SequenceStep(
        "m", [4, 2, 3], 2, [0], True, SamplingParams(temperature=0, min_tokens=3), [5, 4], 1, 1, num_draft_tokens=2
    )
    result = sample(logits, [step], [0], {})
    assert (result.num_accepted["m"], result.token_ids["m"]) == (2, 0)  # outputs 2 and 3 reach min_tokens: EOS


def test_greedy_result_from_row_argmaxes_of_a_mixed_batch() -> None:
    """The argmax of every row (as a replayed step takes them): a one-token step's row is its token, a verification
    step's k + 1 rows accept while they agree with its proposal."""
    steps = [
        _step("p", temperature=0.0),
        SequenceStep("g", [4, 7, 8, 9], 2, [0], True, SamplingParams(temperature=0), [5, 4], 1, 1, num_draft_tokens=3),
        _step("q", temperature=0.0),
    ]
    result = greedy_result(steps, [11, 7, 8, 2, 6, 12])
    assert result.token_ids == {"p": 11, "g": 2, "q": 12} and result.num_accepted == {"g": 2}
    everything = greedy_result(steps[1:2], [7, 8, 9, 3])
    assert (everything.token_ids["g"], everything.num_accepted["g"]) == (3, 3)
