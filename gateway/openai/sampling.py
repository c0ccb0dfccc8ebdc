"""OpenAI/vLLM request fields -> engine `SamplingParams`, and the context-length check."""

from __future__ import annotations

from engines.interface import Tokenizer
from engines.types import SamplingParams
from gateway.errors import ContextLengthExceededError, InvalidRequestError
from gateway.openai.guided import Guidance
from gateway.openai.protocol import SamplingFields


def resolve_max_tokens(requested: int | None, prompt_len: int, max_model_len: int) -> int:
    """The output cap: the request's, or what is left of the context; 400 if the prompt does not fit."""
    room = max_model_len - prompt_len
    if room <= 0 or (requested is not None and requested > room):
        asked = f" plus {requested} output tokens" if requested is not None else ""
        raise ContextLengthExceededError(
            f"This model's maximum context length is {max_model_len} tokens; the prompt has {prompt_len} "
            f"tokens{asked}. Shorten the prompt or lower max_tokens.",
            param="max_tokens" if requested is not None and room > 0 else "messages",
        )
    return requested if requested is not None else room


def refuse_unfittable_text(chars: int, tokenizer: Tokenizer, max_model_len: int, param: str) -> None:
    """400 for a text that cannot fit the context whatever its tokens, told from its length alone: tokenizing
    tens of megabytes only to refuse them took the server's CPU for tens of seconds."""
    per_token = tokenizer.max_chars_per_token
    if per_token and chars > per_token * max_model_len:
        raise ContextLengthExceededError(
            f"This model's maximum context length is {max_model_len} tokens; the prompt has {chars} characters, "
            f"more than {max_model_len} tokens can hold (a token stands for at most {per_token} characters). "
            "Shorten the prompt.",
            param=param,
        )


def to_sampling_params(
    req: SamplingFields,
    max_tokens: int,
    vocab_size: int,
    logprobs: int | None,
    choice: int = 0,
    guidance: Guidance | None = None,
) -> SamplingParams:
    """Build one choice's sampling parameters; choice i > 0 of a seeded request uses seed + i.

    With guided decoding, each choice gets the spec and, when compiled, its own constraint (they advance
    independently).
    """
    bias: dict[int, float] = {}
    for key, value in (req.logit_bias or {}).items():
        token = int(key)
        if not 0 <= token < vocab_size:
            raise InvalidRequestError(f"logit_bias token id {token} is outside the vocabulary", param="logit_bias")
        bias[token] = value
    for token in req.stop_token_ids or []:
        if not 0 <= token < vocab_size:
            raise InvalidRequestError(f"stop token id {token} is outside the vocabulary", param="stop_token_ids")
    if req.min_tokens > max_tokens:
        raise InvalidRequestError("min_tokens must not exceed max_tokens", param="min_tokens")
    if guidance is not None and req.min_tokens:
        # A finished grammar allows only end-of-sequence, which min_tokens forbids: nothing could be sampled.
        raise InvalidRequestError("min_tokens cannot be combined with guided decoding", param="min_tokens")
    seed = None if req.seed is None else (req.seed + choice) % 2**63
    return SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=max(0, req.top_k or 0),
        min_p=req.min_p,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty,
        logit_bias=bias,
        seed=seed,
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        stop=list(req.stop or []),
        stop_token_ids=list(req.stop_token_ids or []),
        include_stop_str_in_output=req.include_stop_str_in_output,
        ignore_eos=req.ignore_eos,
        skip_special_tokens=req.skip_special_tokens,
        logprobs=logprobs,
        guided=guidance.spec if guidance is not None else None,
        constraint=guidance.compiled.constraint() if guidance is not None and guidance.compiled is not None else None,
    )
