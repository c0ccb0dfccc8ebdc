"""Our `SamplingParams` -> vLLM's, and vLLM's logprobs -> our `TokenLogprob` (vLLM imported by the caller).

Every field maps one to one (vLLM is where most of them come from). Output is requested as deltas
(`RequestOutputKind.DELTA`): each update carries only the new tokens and text, which is what we stream.

Guided decoding goes to vLLM's own structured outputs: our `GuidedSpec` kinds are its `StructuredOutputsParams`
fields (`json`, `regex`, `choice`, `grammar`). JSON schemas carry our formatting (`JSON_FORMAT`) as llguidance's
`x-guidance` options, which vLLM's `guidance` backend (the one our engine args select) honours, so answers are
formatted as on the native engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engines.types import JSON_FORMAT, GuidedSpec, SamplingParams, TokenLogprob


def to_vllm_sampling_params(s: SamplingParams) -> Any:
    """A `vllm.SamplingParams` for one sequence; ValueError for what vLLM cannot be asked here."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    if s.constraint is not None and s.guided is None:
        raise ValueError("this guided-decoding constraint cannot be passed to vLLM (it needs a GuidedSpec)")
    return VllmSamplingParams(
        n=1,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k if s.top_k > 0 else 0,
        min_p=s.min_p,
        presence_penalty=s.presence_penalty,
        frequency_penalty=s.frequency_penalty,
        repetition_penalty=s.repetition_penalty,
        logit_bias=dict(s.logit_bias) or None,
        seed=s.seed,
        max_tokens=s.max_tokens,
        min_tokens=s.min_tokens,
        stop=list(s.stop) or None,
        stop_token_ids=list(s.stop_token_ids) or None,
        include_stop_str_in_output=s.include_stop_str_in_output,
        ignore_eos=s.ignore_eos,
        skip_special_tokens=s.skip_special_tokens,
        logprobs=s.logprobs,
        output_kind=RequestOutputKind.DELTA,
        structured_outputs=to_structured_outputs(s.guided) if s.guided is not None else None,
    )


def to_structured_outputs(spec: GuidedSpec) -> Any:
    """A `vllm.sampling_params.StructuredOutputsParams` for our spec."""
    from vllm.sampling_params import StructuredOutputsParams

    fields = spec.structured_outputs()
    schema = fields.get("json")
    if isinstance(schema, dict) and "x-guidance" not in schema:
        fields["json"] = {"x-guidance": JSON_FORMAT, **schema}
    return StructuredOutputsParams(**fields)


def to_token_logprobs(
    token_ids: Sequence[int], logprobs: Sequence[Mapping[int, Any]] | None, k: int
) -> list[TokenLogprob] | None:
    """vLLM gives, per new token, {token id: Logprob(logprob, rank, ...)} holding the top-k and the sampled token.

    Ours: the sampled token's logprob, and the k most likely tokens in rank order (the sampled one among them
    when it ranks in the top k) -- the same shape as the native engine's.
    """
    if logprobs is None:
        return None
    out = []
    for token, entries in zip(token_ids, logprobs, strict=False):
        chosen = entries.get(token)
        ranked = sorted(
            ((tid, lp) for tid, lp in entries.items() if lp.rank is not None and lp.rank <= k),
            key=lambda item: item[1].rank,
        )
        out.append(
            TokenLogprob(
                token_id=token,
                logprob=float(chosen.logprob) if chosen is not None else float("-inf"),
                top=[(tid, float(lp.logprob)) for tid, lp in ranked[:k]],
            )
        )
    return out
