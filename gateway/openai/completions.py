"""POST /v1/completions: prompts as text or token ids, `echo`, `logprobs`, n choices per prompt."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from gateway.errors import InvalidRequestError
from gateway.openai.fanout import Choice, merged_stream, primed
from gateway.openai.guided import request_guidance
from gateway.openai.passthrough import forward
from gateway.openai.protocol import CompletionRequest
from gateway.openai.results import UsageTally, check_output, collect, completion_logprobs, new_id, now, usage
from gateway.openai.sampling import refuse_unfittable_text, resolve_max_tokens, to_sampling_params
from gateway.repository.registry import LoadedLLM

MAX_PROMPTS = 256


async def _prompts(req: CompletionRequest, model: LoadedLLM) -> list[list[int]]:
    """Each prompt's token ids. Text is tokenized off the event loop, and text too long for the context whatever
    its tokens is refused before it is tokenized."""
    tokenizer = model.scheduler.tokenizer
    info = model.scheduler.info
    vocab = info.vocab_size
    raw = req.prompt
    if isinstance(raw, str):
        items: list[str | list[int]] = [raw]
    elif raw and all(isinstance(t, int) for t in raw):
        items = [raw]  # type: ignore[list-item]
    else:
        items = list(raw)  # type: ignore[arg-type]  # strings or token lists: mypy does not narrow through all()
    if not items:
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    if len(items) > MAX_PROMPTS:
        raise InvalidRequestError(f"at most {MAX_PROMPTS} prompts per request", param="prompt")
    texts = [item for item in items if isinstance(item, str)]
    for text in texts:
        refuse_unfittable_text(len(text), tokenizer, info.max_model_len, "prompt")
    encoded = iter(await asyncio.to_thread(lambda: [tokenizer.encode(t) for t in texts]) if texts else [])
    prompts = []
    for item in items:
        ids = next(encoded) if isinstance(item, str) else list(item)
        if not ids:
            raise InvalidRequestError("prompt must not be empty", param="prompt")
        if any(not 0 <= t < vocab for t in ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})", param="prompt")
        prompts.append(ids)
    return prompts


async def completion(
    req: CompletionRequest, model: LoadedLLM, force_usage: bool, session_id: str | None = None
) -> dict[str, Any] | AsyncIterator[dict[str, Any]]:
    scheduler = model.scheduler
    if (direct := scheduler.passthrough) is not None:  # an upstream used as it is tokenizes the prompts itself
        return await forward(direct, "completions", req, model.name, force_usage, req.priority)
    if req.suffix:
        raise InvalidRequestError("suffix is not supported by this model (no fill-in-the-middle)", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise InvalidRequestError("best_of different from n is not supported", param="best_of")
    info = scheduler.info
    prompts = await _prompts(req, model)
    guidance = await request_guidance(req, model)  # vLLM accepts response_format here too
    choices = []
    for p, prompt in enumerate(prompts):
        max_tokens = resolve_max_tokens(req.max_tokens, len(prompt), info.max_model_len)
        for i in range(req.n):
            sampling = to_sampling_params(req, max_tokens, info.vocab_size, req.logprobs, p * req.n + i, guidance)
            choices.append(Choice(p * req.n + i, prompt, sampling))
    prompt_tokens = sum(len(p) for p in prompts)
    tokenizer = scheduler.tokenizer
    echo_text = [""] * len(prompts)
    if req.echo:
        echo_text = await asyncio.to_thread(lambda: [tokenizer.decode(p) for p in prompts])
    stream = merged_stream(scheduler, choices, req.priority, session_id, req.timeout)
    if req.stream:
        include_usage = force_usage or bool(req.stream_options and req.stream_options.include_usage)
        return _chunks(model, req, await primed(stream), echo_text, prompt_tokens, include_usage)

    collected = await collect(stream)
    out_choices = []
    for index, c in sorted(collected.items()):
        prefix = echo_text[index // req.n]
        logprobs = completion_logprobs(tokenizer, c.logprobs, len(prefix)) if req.logprobs is not None else None
        out_choices.append(
            {"index": index, "text": prefix + c.text, "logprobs": logprobs, "finish_reason": c.finish_reason}
        )
    return {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": now(),
        "model": model.name,
        "choices": out_choices,
        "usage": usage(
            prompt_tokens,
            sum(c.completion_tokens for c in collected.values()),
            {i: c.cached_tokens for i, c in collected.items()},
            req.n,
        ),
        "system_fingerprint": None,
    }


async def _chunks(
    model: LoadedLLM,
    req: CompletionRequest,
    stream: AsyncIterator[Any],
    echo_text: list[str],
    prompt_tokens: int,
    include_usage: bool,
) -> AsyncIterator[dict[str, Any]]:
    head = {"id": new_id("cmpl"), "object": "text_completion", "created": now(), "model": model.name}
    tokenizer = model.scheduler.tokenizer
    offsets = {i: len(echo_text[i // req.n]) for i in range(len(echo_text) * req.n)}
    tally = UsageTally(req.n)

    def chunk(index: int, text: str, finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}]}

    if req.echo:
        for index in offsets:
            yield chunk(index, echo_text[index // req.n])
    async for index, out in stream:
        check_output(out)
        tally.add(index, out)
        lp = None
        if req.logprobs is not None and out.logprobs:
            lp = completion_logprobs(tokenizer, out.logprobs, offsets[index])
        offsets[index] += len(out.text)
        if out.text or lp or out.finished:
            yield chunk(index, out.text, out.finish_reason if out.finished else None, lp)
    if include_usage:
        yield {**head, "choices": [], "usage": tally.usage(prompt_tokens)}
