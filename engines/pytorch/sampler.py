"""Per-request sampling over a batch of logits.

Each row carries its own parameters. Seeded requests draw from their own `torch.Generator`, so a seed gives the
same output whatever else is in the batch. Order of operations follows vLLM: penalties and logit bias on the raw
logits, then logprobs (of the penalised distribution), then temperature, top-k, top-p, min-p, and the draw.

A speculative verification step (`SequenceStep.num_draft_tokens` = k) brings k + 1 rows: row j holds the logits
after the sequence plus the first j proposed tokens. Each row is turned into the request's full distribution p_j
at that position exactly as a plain step would (penalties and min_tokens counted over the proposed prefix too, bias,
temperature, top-k/top-p/min-p). The proposal is deterministic (a one-hot draft distribution), so the rejection
rule of speculative sampling (Leviathan et al., Chen et al.) reads: accept proposed token x_j with probability
p_j(x_j); at the first rejection draw from p_j with x_j removed and renormalised; when all k are accepted, draw a
bonus token from p_k. Every emitted token is then distributed exactly as plain sampling's. Under greedy, x_j is
accepted while it is p_j's argmax, and the argmax at the first mismatch (or the bonus position) is emitted: the
tokens plain greedy decoding would have produced. Requests with logprobs or a grammar constraint are not verified
(the scheduler does not propose for them), nor seeded sampled ones (see docs/speculative-decoding.md).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence

import torch

from engines.types import SequenceStep, StepResult, TokenLogprob

log = logging.getLogger("switchyard.engines.pytorch")


class RowError(RuntimeError):
    """One row of a step cannot be sampled (its logits are not finite, its mask allows nothing): the message is
    what that request's client reads; the other rows go on."""


def _apply_penalties(row: torch.Tensor, step: SequenceStep) -> None:
    p = step.sampling
    if p.repetition_penalty != 1.0 and step.history:
        seen = torch.tensor(sorted(set(step.history)), dtype=torch.long)
        vals = row[seen]
        row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and step.num_output_tokens:
        out = torch.tensor(step.history[step.num_prompt_tokens :], dtype=torch.long)
        counts = torch.bincount(out, minlength=row.shape[0])[: row.shape[0]].to(row.dtype)
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)


def _filter(row: torch.Tensor, step: SequenceStep) -> torch.Tensor:
    p = step.sampling
    row = row / p.temperature
    if p.top_k and p.top_k < row.shape[0]:
        kth = torch.topk(row, p.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cum - torch.softmax(sorted_logits, dim=-1) >= p.top_p  # keep the smallest set reaching top_p
        row = row.scatter(0, order, sorted_logits.masked_fill(drop, float("-inf")))
    if p.min_p > 0.0:
        probs = torch.softmax(row, dim=-1)
        row = row.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return row


def plain_greedy(step: SequenceStep) -> bool:
    """Greedy with nothing that edits the logits or needs more than the argmax."""
    p = step.sampling
    return (
        p.greedy
        and p.logprobs is None
        and not p.logit_bias
        and p.constraint is None
        and p.repetition_penalty == 1.0
        and not p.presence_penalty
        and not p.frequency_penalty
        and step.num_output_tokens >= p.min_tokens
    )


def row_error_message(exc: BaseException) -> str:
    """What the client of a row that failed reads: a `RowError`'s own words, otherwise the kind of failure."""
    if isinstance(exc, RowError):
        return str(exc)
    return f"sampling failed for this request ({type(exc).__name__}); see the server log"


def _sample_row(
    row: torch.Tensor, step: SequenceStep, eos_token_ids: Sequence[int], generator: torch.Generator | None
) -> tuple[int, TokenLogprob | None]:
    """One row's token (and its logprobs when asked), editing `row` in place. Raises for this row alone."""
    p = step.sampling
    _processed(row, step, eos_token_ids)
    if p.greedy:
        token = int(torch.argmax(row))
    else:
        probs = torch.softmax(_filter(row, step), dim=-1)
        total = float(probs.sum())
        if not 0.0 < total < float("inf"):  # NaN fails this too
            raise RowError(
                "no token can be sampled for this request: its sampling parameters leave no "
                "probability mass (temperature, top_p, top_k, min_p)"
            )
        token = int(torch.multinomial(probs, 1, generator=generator))
    if p.logprobs is None:
        return token, None
    logp = torch.log_softmax(row, dim=-1)
    top = []
    if p.logprobs > 0:
        values, ids = torch.topk(logp, p.logprobs)
        top = list(zip(ids.tolist(), values.tolist(), strict=True))
    return token, TokenLogprob(token, float(logp[token]), top)


def _processed(row: torch.Tensor, step: SequenceStep, eos_token_ids: Sequence[int]) -> torch.Tensor:
    """`row` after penalties, bias, min_tokens and the constraint's mask (edited in place): what greedy takes the
    argmax of. Raises RowError when nothing can be sampled."""
    p = step.sampling
    if not bool(torch.isfinite(row).all()):
        raise RowError("the model produced non-finite logits (NaN or infinity) for this request")
    _apply_penalties(row, step)
    for token, bias in p.logit_bias.items():
        if 0 <= token < row.shape[0]:
            row[token] += bias
    if step.num_output_tokens < p.min_tokens:
        banned = [t for t in [*eos_token_ids, *p.stop_token_ids] if 0 <= t < row.shape[0]]
        row[banned] = float("-inf")
    if p.constraint is not None:
        allowed = p.constraint.allowed_mask(row.shape[0])
        if allowed is not None:
            row.masked_fill_(~allowed, float("-inf"))
    if not float(row.max()) > float("-inf"):  # NaN, or every token banned
        raise RowError(
            "no token can be sampled for this request: its penalties, logit_bias and constraints leave no finite logit"
        )
    return row


def _at_draft(step: SequenceStep, j: int) -> SequenceStep:
    """The step as a plain decode after the first `j` proposed tokens were accepted (for penalties, min_tokens)."""
    if not j:
        return step
    drafts = step.draft_token_ids
    return dataclasses.replace(
        step,
        history=[*step.history, *drafts[:j]],
        num_output_tokens=step.num_output_tokens + j,
        num_draft_tokens=0,
        token_ids=[drafts[j - 1]],
        start_pos=step.start_pos + j,
    )


def accept_greedy(drafts: Sequence[int], tokens: Sequence[int]) -> tuple[int, int]:
    """(accepted proposed tokens, the token after them) for a plain greedy verification from its k + 1 rows' argmax:
    proposed tokens are accepted while each is the argmax of the row before it."""
    for j, draft in enumerate(drafts):
        if tokens[j] != draft:
            return j, tokens[j]
    return len(drafts), tokens[len(drafts)]


def verify_rows(
    rows: torch.Tensor,
    step: SequenceStep,
    eos_token_ids: Sequence[int],
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """(accepted proposed tokens, the token after them) for a verification step's k + 1 rows of logits, by the rule
    in this module's docstring."""
    drafts = step.draft_token_ids
    for j in range(len(drafts) + 1):
        at = _at_draft(step, j)
        row = _processed(rows[j], at, eos_token_ids)
        if step.sampling.greedy:
            token = int(torch.argmax(row))
        else:
            probs = torch.softmax(_filter(row, at), dim=-1)
            total = float(probs.sum())
            if not 0.0 < total < float("inf"):
                raise RowError(
                    "no token can be sampled for this request: its sampling parameters leave no "
                    "probability mass (temperature, top_p, top_k, min_p)"
                )
            if j == len(drafts):  # every proposed token accepted: the bonus token
                return j, int(torch.multinomial(probs, 1, generator=generator))
            x = drafts[j]
            if float(torch.rand(1, generator=generator, dtype=torch.float64)) * total < float(probs[x]):
                continue  # accepted with probability p(x)
            probs[x] = 0.0  # rejected: draw from p without x (multinomial renormalises)
            if not float(probs.sum()) > 0.0:  # p was x alone: then it was accepted with probability 1
                continue
            return j, int(torch.multinomial(probs, 1, generator=generator))
        if j == len(drafts) or token != drafts[j]:
            return j, token
    raise AssertionError("unreachable")


def _row_starts(steps: Sequence[SequenceStep]) -> list[int]:
    """Each step's first row of logits (a verification step has k + 1)."""
    starts, first = [], 0
    for step in steps:
        starts.append(first)
        first += 1 + step.num_draft_tokens
    return starts


def greedy_result(steps: Sequence[SequenceStep], tokens: list[int]) -> StepResult:
    """The step's result for plain greedy `steps` from each row's argmax (`tokens`, the rows of `sample`'s logits,
    all finite): a verification step accepts its proposed tokens while they are the argmax."""
    if len(tokens) == len(steps):
        return StepResult(token_ids=dict(zip((s.seq_id for s in steps), tokens, strict=True)))
    result = StepResult(token_ids={})
    for i, step in zip(_row_starts(steps), steps, strict=True):
        if step.num_draft_tokens:
            accepted, token = accept_greedy(step.draft_token_ids, tokens[i : i + 1 + step.num_draft_tokens])
            result.num_accepted[step.seq_id] = accepted
        else:
            token = tokens[i]
        result.token_ids[step.seq_id] = token
    return result


def sample(
    logits: torch.Tensor,
    steps: Sequence[SequenceStep],
    eos_token_ids: Sequence[int],
    generators: dict[str, torch.Generator],
    argmax: Callable[[torch.Tensor], list[int]] | None = None,
) -> StepResult:
    """Pick one token per step from `logits` ([S, V] float32: one row per step, k + 1 for a verification step, in
    the order of `steps`). `argmax`: each row's greedy token, for a batch that is all plain greedy (default:
    torch's).

    A step that cannot be sampled (non-finite logits, a constraint or parameters that leave nothing, any exception
    in its own work) gets an entry in `errors` instead of a token; the other steps are sampled as if it were not
    there."""
    starts = _row_starts(steps)
    if steps and all(plain_greedy(s) for s in steps) and bool(torch.isfinite(logits).all()):
        # the common case: one argmax for the whole batch
        tokens = argmax(logits) if argmax is not None else logits.argmax(dim=-1).tolist()
        return greedy_result(steps, tokens)
    result = StepResult(token_ids={})
    for i, step in zip(starts, steps, strict=True):
        try:
            if step.num_draft_tokens:
                accepted, token = verify_rows(
                    logits[i : i + 1 + step.num_draft_tokens], step, eos_token_ids, generators.get(step.seq_id)
                )
                result.num_accepted[step.seq_id], logprob = accepted, None
            else:
                token, logprob = _sample_row(logits[i], step, eos_token_ids, generators.get(step.seq_id))
        except Exception as exc:  # this row's failure is this row's alone
            if not isinstance(exc, RowError):
                log.exception("sampling failed for %s", step.seq_id)
            result.errors[step.seq_id] = row_error_message(exc)
            continue
        result.token_ids[step.seq_id] = token
        if logprob is not None:
            result.logprobs[step.seq_id] = logprob
    return result
