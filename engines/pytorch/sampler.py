"""Per-request sampling over a batch of logits.

Each row carries its own parameters. Seeded requests draw from their own `torch.Generator`, so a seed gives the
same output whatever else is in the batch. Order of operations follows vLLM: penalties and logit bias on the raw
logits, then logprobs (of the penalised distribution), then temperature, top-k, top-p, min-p, and the draw.
"""

from __future__ import annotations

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


def _plain_greedy(step: SequenceStep) -> bool:
    """Greedy with nothing that edits the logits or needs more than the argmax."""
    p = step.sampling
    return (
        p.greedy and p.logprobs is None and not p.logit_bias and p.constraint is None
        and p.repetition_penalty == 1.0 and not p.presence_penalty and not p.frequency_penalty
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
        raise RowError("no token can be sampled for this request: its penalties, logit_bias and constraints "
                       "leave no finite logit")
    if p.greedy:
        token = int(torch.argmax(row))
    else:
        probs = torch.softmax(_filter(row, step), dim=-1)
        total = float(probs.sum())
        if not 0.0 < total < float("inf"):  # NaN fails this too
            raise RowError("no token can be sampled for this request: its sampling parameters leave no "
                           "probability mass (temperature, top_p, top_k, min_p)")
        token = int(torch.multinomial(probs, 1, generator=generator))
    if p.logprobs is None:
        return token, None
    logp = torch.log_softmax(row, dim=-1)
    top = []
    if p.logprobs > 0:
        values, ids = torch.topk(logp, p.logprobs)
        top = list(zip(ids.tolist(), values.tolist(), strict=True))
    return token, TokenLogprob(token, float(logp[token]), top)


def sample(
    logits: torch.Tensor,
    steps: Sequence[SequenceStep],
    eos_token_ids: Sequence[int],
    generators: dict[str, torch.Generator],
    argmax: Callable[[torch.Tensor], list[int]] | None = None,
) -> StepResult:
    """Pick one token per row of `logits` ([S, V] float32; row i belongs to `steps[i]`). `argmax`: each row's
    greedy token, for a batch that is all plain greedy (default: torch's).

    A row that cannot be sampled (non-finite logits, a constraint or parameters that leave nothing, any exception
    in its own work) gets an entry in `errors` instead of a token; the other rows are sampled as if it were not
    there."""
    if steps and all(_plain_greedy(s) for s in steps) and bool(torch.isfinite(logits).all()):
        # the common case: one argmax for the whole batch
        tokens = argmax(logits) if argmax is not None else logits.argmax(dim=-1).tolist()
        return StepResult(token_ids=dict(zip((s.seq_id for s in steps), tokens, strict=True)))
    result = StepResult(token_ids={})
    for i, step in enumerate(steps):
        try:
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
