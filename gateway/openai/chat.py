"""POST /v1/chat/completions: messages -> the model's chat template -> generation -> OpenAI's shapes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import jinja2

from gateway.errors import InvalidRequestError
from gateway.openai.fanout import Choice, merged_stream
from gateway.openai.protocol import ChatCompletionRequest, ChatMessage
from gateway.openai.results import check_output, chat_logprobs, collect, new_id, now, usage
from gateway.openai.sampling import resolve_max_tokens, to_sampling_params
from gateway.repository.registry import LoadedModel


def _message_dict(i: int, msg: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": msg.role}
    if isinstance(msg.content, list):
        texts = []
        for part in msg.content:
            if part.type != "text" or part.text is None:
                raise InvalidRequestError(
                    f"content part type '{part.type[:32]}' is not supported by this model; send text parts",
                    param=f"messages.{i}.content",
                )
            texts.append(part.text)
        out["content"] = "\n".join(texts)
    elif msg.content is not None:
        out["content"] = msg.content
    elif not msg.tool_calls:
        raise InvalidRequestError("a message needs content", param=f"messages.{i}.content")
    else:
        out["content"] = ""
    for key in ("name", "tool_calls", "tool_call_id"):
        if getattr(msg, key) is not None:
            out[key] = getattr(msg, key)
    return out


async def _render_prompt(model: LoadedModel, req: ChatCompletionRequest) -> list[int]:
    messages = [_message_dict(i, m) for i, m in enumerate(req.messages)]
    kwargs = dict(req.chat_template_kwargs or {})
    for reserved in ("messages", "tools", "add_generation_prompt", "tokenize", "chat_template"):
        kwargs.pop(reserved, None)
    try:
        # Templates are Jinja run in transformers' sandbox; keep the rendering off the event loop.
        prompt = await asyncio.to_thread(model.scheduler.tokenizer.apply_chat_template, messages, None, True, **kwargs)
    except jinja2.TemplateError as exc:
        raise InvalidRequestError(f"the chat template rejected the messages: {str(exc)[:200]}", param="messages") from None
    if not prompt:
        raise InvalidRequestError("the messages render to an empty prompt", param="messages")
    return prompt


async def chat_completion(req: ChatCompletionRequest, model: LoadedModel, force_usage: bool) -> dict[str, Any] | AsyncIterator[dict[str, Any]]:
    """Return the response body, or (when `req.stream`) an iterator of chunk bodies for SSE."""
    scheduler = model.scheduler
    info = scheduler.info
    prompt = await _render_prompt(model, req)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = resolve_max_tokens(requested, len(prompt), info.max_model_len)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    choices = [
        Choice(i, prompt, to_sampling_params(req, max_tokens, info.vocab_size, logprobs, i)) for i in range(req.n)
    ]
    stream = merged_stream(scheduler, choices, req.priority)
    if req.stream:
        include_usage = force_usage or bool(req.stream_options and req.stream_options.include_usage)
        return _chunks(model, req, stream, len(prompt), include_usage)

    collected = await collect(stream)
    tokenizer = scheduler.tokenizer
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": now(),
        "model": model.name,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": chat_logprobs(tokenizer, c.logprobs) if logprobs is not None else None,
                "finish_reason": c.finish_reason,
            }
            for i, c in sorted(collected.items())
        ],
        "usage": usage(len(prompt), sum(c.completion_tokens for c in collected.values())),
        "system_fingerprint": None,
    }


async def _chunks(model: LoadedModel, req: ChatCompletionRequest, stream: AsyncIterator[Any], prompt_len: int, include_usage: bool) -> AsyncIterator[dict[str, Any]]:
    head = {"id": new_id("chatcmpl"), "object": "chat.completion.chunk", "created": now(), "model": model.name}
    tokenizer = model.scheduler.tokenizer

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}

    for i in range(req.n):
        yield chunk(i, {"role": "assistant", "content": ""})
    completion_tokens: dict[int, int] = {}
    async for index, out in stream:
        check_output(out)
        completion_tokens[index] = out.completion_tokens
        if out.text or out.logprobs:
            lp = chat_logprobs(tokenizer, out.logprobs) if req.logprobs and out.logprobs else None
            yield chunk(index, {"content": out.text}, logprobs=lp)
        if out.finished:
            yield chunk(index, {}, finish=out.finish_reason)
    if include_usage:
        yield {**head, "choices": [], "usage": usage(prompt_len, sum(completion_tokens.values()))}
