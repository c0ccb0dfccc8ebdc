"""The upstream wire format: our request -> a streaming `/v1/completions` body; its SSE chunks -> our updates.

Why `/v1/completions` with token ids: the gateway has already rendered the chat template and tokenized the prompt
(with the model's own tokenizer), so sending the ids keeps the prompt exact -- no second template rendering that
could differ, and prompt token counts agree on both sides. vLLM, SGLang and Switchyard accept token-id prompts.
vLLM's extra sampling fields (top_k, min_p, ...) are sent only when they differ from their defaults, so a strict
upstream sees only the fields it must know. Guided decoding travels as vLLM's `structured_outputs` (the upstream
enforces it; vLLM 0.32 no longer reads the older `guided_*` fields).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from engines.interface import Tokenizer
from engines.types import GenerationRequest, SamplingParams, TokenLogprob

_TOKEN_ID_PREFIX = "token_id:"  # vLLM's `return_tokens_as_token_ids` spelling of a logprob token


def completion_body(model: str, request: GenerationRequest) -> dict[str, Any]:
    """The upstream request for one sequence; ValueError for what an upstream cannot be asked to do."""
    s: SamplingParams = request.sampling
    if s.constraint is not None and s.guided is None:
        raise ValueError("this guided-decoding constraint cannot be sent to an upstream (it needs a GuidedSpec)")
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(request.prompt_token_ids),
        "max_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if s.seed is not None:
        body["seed"] = s.seed
    if s.stop:
        body["stop"] = list(s.stop)
    if s.presence_penalty:
        body["presence_penalty"] = s.presence_penalty
    if s.frequency_penalty:
        body["frequency_penalty"] = s.frequency_penalty
    if s.logit_bias:
        body["logit_bias"] = {str(k): v for k, v in s.logit_bias.items()}
    if s.logprobs is not None:
        body["logprobs"] = s.logprobs
        body["return_tokens_as_token_ids"] = True
    extras = {
        "top_k": (s.top_k, 0),
        "min_p": (s.min_p, 0.0),
        "repetition_penalty": (s.repetition_penalty, 1.0),
        "min_tokens": (s.min_tokens, 0),
        "stop_token_ids": (list(s.stop_token_ids), []),
        "include_stop_str_in_output": (s.include_stop_str_in_output, False),
        "ignore_eos": (s.ignore_eos, False),
        "skip_special_tokens": (s.skip_special_tokens, True),
    }
    body.update({name: value for name, (value, default) in extras.items() if value != default})
    if s.guided is not None:
        # Lark grammars use llguidance's dialect, which a vLLM upstream hands to its guidance backend when xgrammar
        # cannot read them; JSON schemas go as they are (already closed by the gateway).
        body["structured_outputs"] = s.guided.structured_outputs()
    return body


def sse_data(line: str) -> str | None:
    """The payload of an SSE `data:` line; None for comments, other fields and blank lines."""
    if not line.startswith("data:"):
        return None
    return line[5:].lstrip(" ")


class UpstreamError(Exception):
    """The upstream reported an error inside its stream."""


@dataclass
class Delta:
    """What one upstream chunk contributed to the sequence."""

    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: Any = None
    usage: dict[str, Any] | None = None


class TokenIds:
    """Token text -> id, for logprobs from upstreams that name tokens by text only (a best effort: exact for
    vLLM's `token_id:N`, otherwise the id that the text encodes to when it is one token)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._cache: dict[str, int] = {}

    def __call__(self, token: str) -> int:
        if token.startswith(_TOKEN_ID_PREFIX) and token[len(_TOKEN_ID_PREFIX) :].isdigit():
            return int(token[len(_TOKEN_ID_PREFIX) :])
        found = self._cache.get(token)
        if found is None:
            ids = self._tok.encode(token, add_special_tokens=False)
            found = self._cache[token] = ids[0] if ids else -1
            if len(self._cache) > 65536:
                self._cache.clear()
        return found


def parse_chunk(data: str, token_ids: TokenIds) -> Delta:
    """One SSE payload of a streaming completion; UpstreamError for an in-stream error, ValueError for garbage."""
    try:
        obj = json.loads(data)
    except json.JSONDecodeError:
        raise ValueError("the upstream sent a chunk that is not JSON") from None
    if not isinstance(obj, dict):
        raise ValueError("the upstream sent a chunk that is not a JSON object")
    if "error" in obj:
        err = obj["error"]
        message = err.get("message") if isinstance(err, dict) else err
        raise UpstreamError(str(message)[:500])
    delta = Delta(usage=obj.get("usage") if isinstance(obj.get("usage"), dict) else None)
    for choice in obj.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta.text += choice.get("text") or ""
        delta.finish_reason = choice.get("finish_reason") or delta.finish_reason
        delta.stop_reason = choice.get("stop_reason", delta.stop_reason)
        lp = choice.get("logprobs")
        if isinstance(lp, dict):
            delta.logprobs.extend(_logprobs(lp, token_ids))
    return delta


def _logprobs(lp: dict[str, Any], token_ids: TokenIds) -> list[TokenLogprob]:
    """OpenAI completions logprobs (tokens, token_logprobs, top_logprobs) -> our per-token entries."""
    tokens = lp.get("tokens") or []
    values = lp.get("token_logprobs") or []
    tops = lp.get("top_logprobs") or []
    out = []
    for i, token in enumerate(tokens):
        value = values[i] if i < len(values) and values[i] is not None else float("-inf")
        top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        out.append(
            TokenLogprob(
                token_id=token_ids(str(token)),
                logprob=float(value),
                top=[(token_ids(str(t)), float(v)) for t, v in top.items()],
            )
        )
    return out
