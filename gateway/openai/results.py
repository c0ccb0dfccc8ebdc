"""Shared pieces of chat and completion responses: ids, usage, collected choices, logprob shapes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from engines.interface import Tokenizer
from engines.types import GenerationOutput, TokenLogprob
from gateway.errors import InternalError, ServiceUnavailableError
from gateway.http.ids import random_hex


def new_id(prefix: str) -> str:
    return f"{prefix}-{random_hex()}"


def now() -> int:
    return int(time.time())


def check_output(out: GenerationOutput) -> None:
    """Turn an engine-side failure into the error the client should see."""
    if out.finish_reason == "error":
        raise InternalError(out.error or "the model failed while generating")
    if out.finish_reason == "abort":
        raise ServiceUnavailableError(out.error or "the request was aborted", headers={"Retry-After": "1"})


@dataclass
class CollectedChoice:
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the engine found in its prefix cache (or KV session)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)


async def collect(stream: AsyncIterator[tuple[int, GenerationOutput]]) -> dict[int, CollectedChoice]:
    choices: dict[int, CollectedChoice] = {}
    async for index, out in stream:
        check_output(out)
        c = choices.setdefault(index, CollectedChoice())
        c.text += out.text
        c.token_ids.extend(out.new_token_ids)
        c.logprobs.extend(out.logprobs or [])
        c.prompt_tokens = out.prompt_tokens
        c.completion_tokens = out.completion_tokens
        c.cached_tokens = max(c.cached_tokens, out.cached_prompt_tokens)
        if out.finished:
            c.finish_reason = out.finish_reason
    return choices


def usage(
    prompt_tokens: int, completion_tokens: int, cached: dict[int, int] | None = None, n: int = 1
) -> dict[str, Any]:
    """OpenAI's usage object. `cached` maps choice index -> prompt tokens served from the prefix cache; the `n`
    choices of one prompt share it, so each prompt counts once."""
    per_prompt: dict[int, int] = {}
    for index, tokens in (cached or {}).items():
        per_prompt[index // n] = max(per_prompt.get(index // n, 0), tokens)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": sum(per_prompt.values())},
    }


@dataclass
class UsageTally:
    """A streamed response's token counts per choice, for its closing usage chunk."""

    n: int  # choices per prompt
    completion: dict[int, int] = field(default_factory=dict)
    cached: dict[int, int] = field(default_factory=dict)

    def add(self, index: int, out: GenerationOutput) -> None:
        self.completion[index] = out.completion_tokens
        self.cached[index] = max(self.cached.get(index, 0), out.cached_prompt_tokens)

    def usage(self, prompt_tokens: int) -> dict[str, Any]:
        return usage(prompt_tokens, sum(self.completion.values()), self.cached, self.n)


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def chat_logprobs(tokenizer: Tokenizer, items: list[TokenLogprob]) -> dict[str, Any]:
    """OpenAI chat shape: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = token_text(tokenizer, token_id)
        return {"token": text, "logprob": max(logprob, -9999.0), "bytes": list(text.encode("utf-8"))}

    return {
        "content": [
            {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]} for lp in items
        ]
    }


def completion_logprobs(tokenizer: Tokenizer, items: list[TokenLogprob], text_start: int) -> dict[str, Any]:
    """OpenAI completions shape: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    offset = text_start
    for lp in items:
        text = token_text(tokenizer, lp.token_id)
        tokens.append(text)
        token_logprobs.append(max(lp.logprob, -9999.0))
        tops.append({token_text(tokenizer, t): max(v, -9999.0) for t, v in lp.top} if lp.top else None)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}
