"""POST /v1/chat/completions: messages -> the model's chat template -> generation -> OpenAI's shapes.

Tools (tools.py, gateway/llm/tool_parsers/) and `response_format` (guided.py) shape both ends: they add to the
prompt and constrain sampling, and the answer is read back into `message.tool_calls` or streamed as tool-call
deltas. A model that reasons (gateway/llm/reasoning.py) has its reasoning split off first, into
`reasoning_content` / `reasoning`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from gateway.llm.reasoning import Reasoning, reasoning_for
from gateway.llm.tool_parsers import ToolCallDelta, new_call_id
from gateway.openai.chat_template import render_chat
from gateway.openai.fanout import Choice, merged_stream, primed
from gateway.openai.guided import request_guidance
from gateway.openai.passthrough import forward
from gateway.openai.protocol import ChatCompletionRequest
from gateway.openai.results import (
    CollectedChoice,
    UsageTally,
    chat_logprobs,
    check_output,
    collect,
    new_id,
    now,
    usage,
)
from gateway.openai.sampling import refuse_unfittable_text, resolve_max_tokens, to_sampling_params
from gateway.openai.tools import ToolPlan, plan_tools, tool_guidance
from gateway.repository.registry import LoadedLLM


def _finish_reason(reason: str | None, called: bool) -> str | None:
    return "tool_calls" if called and reason == "stop" else reason


def _message(c: CollectedChoice, plan: ToolPlan, reasoning: Reasoning | None) -> tuple[dict[str, Any], str | None]:
    text = c.text
    message: dict[str, Any] = {"role": "assistant"}
    if reasoning is not None:
        split = reasoning.split(text)
        text = split.content
        if split.reasoning is not None:
            message |= {"reasoning_content": split.reasoning, "reasoning": split.reasoning}
    if plan.active and plan.parser is not None:
        if plan.constrained:  # a forced call is never text, even when max_tokens cut it (finish_reason "length")
            content, calls = None, plan.parser.parse_forced(text, plan.call_names)
        else:
            content, calls = plan.parser.parse(text, plan.names)
        calls = calls[: plan.max_calls]
        if calls or plan.constrained:
            message["content"] = content
            if calls:
                message["tool_calls"] = [
                    {
                        "id": new_call_id(),
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                    for call in calls
                ]
            return message, _finish_reason(c.finish_reason, bool(calls))
    message["content"] = None if not text and "reasoning" in message else text
    return message, c.finish_reason


async def chat_prompt(req: ChatCompletionRequest, model: LoadedLLM) -> tuple[list[int], ToolPlan]:
    """The prompt's token ids (chat template, tools, past calls) and the request's checked tool plan."""
    plan = plan_tools(req, model)
    # The dialect is also needed to write past calls into the prompt when the template cannot.
    parser = plan.parser or (model.parsers.tool if any(m.tool_calls for m in req.messages) else None)
    text = sum(
        len(m.content) if isinstance(m.content, str) else sum(len(p.text or "") for p in m.content or [])
        for m in req.messages
    )
    refuse_unfittable_text(text, model.scheduler.tokenizer, model.scheduler.info.max_model_len, "messages")
    prompt = await render_chat(
        model.scheduler.tokenizer,
        req.messages,
        plan.tools if plan.active else None,
        parser,
        req.chat_template_kwargs,
        support=model.template_support,
    )
    return prompt, plan


async def chat_completion(
    req: ChatCompletionRequest, model: LoadedLLM, force_usage: bool, session_id: str | None = None
) -> dict[str, Any] | AsyncIterator[dict[str, Any]]:
    """Return the response body, or (when `req.stream`) an iterator of chunk bodies for SSE."""
    scheduler = model.scheduler
    if (direct := scheduler.passthrough) is not None:  # an upstream used as it is renders its own template
        return await forward(direct, "chat/completions", req, model.name, force_usage, req.priority)
    info = scheduler.info
    prompt, plan = await chat_prompt(req, model)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = resolve_max_tokens(requested, len(prompt), info.max_model_len)
    guidance = await tool_guidance(plan, model) if plan.constrained else None
    if guidance is None:
        guidance = await request_guidance(req, model)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    reasoning = reasoning_for(model.parsers.reasoning, scheduler.tokenizer, prompt, guidance is not None)
    if (plan.active and plan.parser is not None and plan.parser.needs_special_tokens) or (
        reasoning is not None and reasoning.parser.needs_special_tokens
    ):
        req = req.model_copy(update={"skip_special_tokens": False})  # the markers read are special tokens
    choices = [
        Choice(i, prompt, to_sampling_params(req, max_tokens, info.vocab_size, logprobs, i, guidance))
        for i in range(req.n)
    ]
    stream = merged_stream(scheduler, choices, req.priority, session_id, req.timeout)
    if req.stream:
        include_usage = force_usage or bool(req.stream_options and req.stream_options.include_usage)
        return _chunks(model, req, plan, reasoning, await primed(stream), len(prompt), include_usage)

    collected = await collect(stream)
    tokenizer = scheduler.tokenizer
    out_choices = []
    for i, c in sorted(collected.items()):
        message, finish = _message(c, plan, reasoning)
        out_choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": chat_logprobs(tokenizer, c.logprobs) if logprobs is not None else None,
                "finish_reason": finish,
            }
        )
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": now(),
        "model": model.name,
        "choices": out_choices,
        "usage": usage(
            len(prompt),
            sum(c.completion_tokens for c in collected.values()),
            {i: c.cached_tokens for i, c in collected.items()},
            req.n,
        ),
        "system_fingerprint": None,
    }


async def _chunks(
    model: LoadedLLM,
    req: ChatCompletionRequest,
    plan: ToolPlan,
    reasoning: Reasoning | None,
    stream: AsyncIterator[Any],
    prompt_len: int,
    include_usage: bool,
) -> AsyncIterator[dict[str, Any]]:
    head = {"id": new_id("chatcmpl"), "object": "chat.completion.chunk", "created": now(), "model": model.name}
    tokenizer = model.scheduler.tokenizer
    streamers = (
        {i: plan.parser.streamer(plan.call_names, plan.constrained, plan.max_calls) for i in range(req.n)}
        if plan.active and plan.parser is not None
        else {}
    )
    thinkers = {i: reasoning.streamer() for i in range(req.n)} if reasoning is not None else {}

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}

    for i in range(req.n):
        yield chunk(i, {"role": "assistant", "content": ""})
    tally = UsageTally(req.n)
    try:
        async for index, out in stream:
            check_output(out)
            tally.add(index, out)
            lp = chat_logprobs(tokenizer, out.logprobs) if req.logprobs and out.logprobs else None
            streamer = streamers.get(index)
            thinker = thinkers.get(index)
            text, thought = out.text, ""
            if thinker is not None:
                thought, text = thinker.feed(text)
                if out.finished:
                    more_thought, more_text = thinker.finish()
                    thought, text = thought + more_thought, text + more_text
            if streamer is None:
                events: list[Any] = [text] if text else []
            else:
                events = streamer.feed(text) + (streamer.finish() if out.finished else [])
            if thought:
                yield chunk(index, {"reasoning_content": thought, "reasoning": thought}, logprobs=lp)
                lp = None
            for delta in _deltas(events):
                yield chunk(index, delta, logprobs=lp)
                lp = None
            if lp is not None:
                yield chunk(index, {"content": ""}, logprobs=lp)
            if out.finished:
                yield chunk(index, {}, finish=_finish_reason(out.finish_reason, bool(streamer and streamer.calls)))
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    if include_usage:
        yield {**head, "choices": [], "usage": tally.usage(prompt_len)}


def _deltas(events: list[Any]) -> list[dict[str, Any]]:
    """Content runs become one `content` delta; each tool-call piece its own `tool_calls` delta, in order."""
    out: list[dict[str, Any]] = []
    text = ""
    for event in events:
        if isinstance(event, ToolCallDelta):
            if text:
                out.append({"content": text})
                text = ""
            out.append({"tool_calls": [event.to_openai()]})
        else:
            text += event
    if text:
        out.append({"content": text})
    return out
