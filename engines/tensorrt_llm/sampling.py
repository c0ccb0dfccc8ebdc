"""Our `SamplingParams` -> TensorRT-LLM's `SamplingParams`, and its logprobs -> our `TokenLogprob`.

Differences from vLLM that the mapping absorbs:
* greedy is `top_k=1` (TensorRT-LLM wants temperature > 0 and treats top_k=1 as argmax);
* `logit_bias` becomes `embedding_bias`, a float32 tensor [vocab_size] added to the logits;
* guided decoding runs our own `TokenConstraint` as a per-request logits processor (PyTorch backend), so
  `response_format` and forced tool calls behave exactly as on the native engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engines.token_constraint import TokenConstraint
from engines.types import SamplingParams, TokenLogprob


class ConstraintLogitsProcessor:
    """Applies a `TokenConstraint` inside TensorRT-LLM: advance past the tokens sampled since the last call, then
    ban every token the grammar does not allow now. Called by TensorRT-LLM as
    `(req_id, logits, token_ids, stream_ptr, client_id)`, with `logits` modified in place."""

    def __init__(self, constraint: TokenConstraint) -> None:
        self._constraint = constraint
        self._seen: int | None = None  # the constraint has accepted every token before this position

    def __call__(self, req_id: int, logits: Any, token_ids: list[list[int]], stream_ptr: Any, client_id: Any) -> None:
        import torch

        beam = token_ids[0]
        # The first call comes before any token is sampled, whether or not `token_ids` holds the prompt.
        for token in beam[self._seen if self._seen is not None else len(beam) :]:
            self._constraint.accept(token)
        self._seen = len(beam)
        vocab = logits.shape[-1]
        mask = self._constraint.allowed_mask(vocab)
        if mask is None:
            return
        stream = torch.cuda.ExternalStream(stream_ptr) if stream_ptr else None
        ctx = torch.cuda.stream(stream) if stream is not None else _null()
        with ctx:
            banned = ~mask.to(device=logits.device)
            logits.view(-1, vocab)[:, banned] = float("-inf")


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def to_trtllm_sampling_params(s: SamplingParams, module: Any, vocab_size: int, eos_token_id: int | None) -> Any:
    """A `tensorrt_llm.SamplingParams` for one sequence (`module` is the imported `tensorrt_llm`)."""
    kwargs: dict[str, Any] = {
        "max_tokens": s.max_tokens,
        "n": 1,
        "seed": s.seed,
        "min_tokens": s.min_tokens or None,
        "presence_penalty": s.presence_penalty or None,
        "frequency_penalty": s.frequency_penalty or None,
        "repetition_penalty": s.repetition_penalty if s.repetition_penalty != 1.0 else None,
        "stop": list(s.stop) or None,
        "stop_token_ids": list(s.stop_token_ids) or None,
        "include_stop_str_in_output": s.include_stop_str_in_output,
        "ignore_eos": s.ignore_eos,
        "skip_special_tokens": s.skip_special_tokens,
        "logprobs": s.logprobs,
        "end_id": eos_token_id,
    }
    if s.greedy:
        kwargs.update(top_k=1, top_p=None, temperature=None)
    else:
        kwargs.update(
            temperature=s.temperature,
            top_p=s.top_p if s.top_p < 1.0 else None,
            top_k=s.top_k or None,
            min_p=s.min_p or None,
        )
    if s.logit_bias:
        import torch

        bias = torch.zeros(vocab_size, dtype=torch.float32)
        for token, value in s.logit_bias.items():
            bias[token] = value
        kwargs["embedding_bias"] = bias
    if s.constraint is not None:
        kwargs["logits_processor"] = ConstraintLogitsProcessor(s.constraint)
    return module.SamplingParams(**kwargs)


def to_token_logprobs(token_ids: Sequence[int], logprobs: Sequence[Any] | None, k: int) -> list[TokenLogprob] | None:
    """TensorRT-LLM gives per new token either {token id: Logprob(logprob, rank)} or (older releases) a float."""
    if not logprobs:
        return None
    out = []
    for token, entry in zip(token_ids, logprobs, strict=False):
        if isinstance(entry, Mapping):
            chosen = entry.get(token)
            ranked = sorted(
                ((tid, lp) for tid, lp in entry.items() if getattr(lp, "rank", None) is not None and lp.rank <= k),
                key=lambda item: item[1].rank,
            )
            value = float(chosen.logprob) if chosen is not None else float("-inf")
            out.append(TokenLogprob(token, value, [(tid, float(lp.logprob)) for tid, lp in ranked[:k]]))
        else:
            out.append(TokenLogprob(token, float(entry), []))
    return out
