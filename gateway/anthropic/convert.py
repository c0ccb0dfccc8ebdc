"""Messages <-> chat: an Anthropic request becomes a chat request, a chat answer becomes a Message.

The chat path does the work (chat template, sampling, forced tools through guided decoding, the model's tool-call
dialect and reasoning parser: reasoning becomes a thinking block), so /v1/messages and /v1/chat/completions give
the same answer for the same conversation. Stop sequences are generated with the matched string kept in the text,
so the answer can say which one matched (`stop_sequence`), as Anthropic's does, and the string is cut here.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from gateway.anthropic.protocol import CountTokensRequest, MessagesRequest, TextBlock, ToolResultBlock, ToolUseBlock
from gateway.errors import InvalidRequestError
from gateway.openai.protocol import ChatCompletionRequest

STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "stop": "end_turn"}


def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "\n".join(b.text for b in content)


def chat_messages(req: CountTokensRequest) -> list[dict[str, Any]]:
    """Anthropic messages as chat messages: tool results become `tool` messages answering the calls before them."""
    out: list[dict[str, Any]] = []
    if req.system:
        out.append({"role": "system", "content": _text(req.system)})
    calls: set[str] = set()  # the tool_use ids the latest assistant turn made
    for i, msg in enumerate(req.messages):
        where = f"messages.{i}.content"
        if isinstance(msg.content, str):
            out.append({"role": msg.role, "content": msg.content})
            continue
        texts = [b.text for b in msg.content if isinstance(b, TextBlock)]
        if msg.role == "assistant":
            uses = [b for b in msg.content if isinstance(b, ToolUseBlock)]
            calls = {b.id for b in uses}
            message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or (None if uses else "")}
            if uses:
                message["tool_calls"] = [
                    {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                    for b in uses
                ]
            out.append(message)
            continue
        for block in msg.content:
            if isinstance(block, ToolUseBlock):
                raise InvalidRequestError(f"{where}: tool_use blocks belong in assistant messages", param=where)
            if isinstance(block, ToolResultBlock):
                if block.tool_use_id not in calls:
                    raise InvalidRequestError(
                        f"{where}: tool_result block(s) provided for tool_use id '{block.tool_use_id[:64]}', which "
                        "the previous assistant message did not make",
                        param=where,
                    )
                result = _text(block.content)
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": block.tool_use_id,
                        "content": f"Error: {result}" if block.is_error else result,
                    }
                )
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
    if req.messages[-1].role == "assistant":
        raise InvalidRequestError(
            "the last message must be from the user: prefilling the assistant's answer is not supported by this server",
            param="messages",
        )
    return out


def _tool_choice(req: CountTokensRequest) -> tuple[Any, bool]:
    """Chat's tool_choice and parallel_tool_calls."""
    choice = req.tool_choice
    if choice is None:
        return None, True
    parallel = not choice.disable_parallel_tool_use
    if choice.type == "tool":
        if not choice.name:
            raise InvalidRequestError(
                "tool_choice.name: a tool choice of type 'tool' names the tool", param="tool_choice"
            )
        if choice.name not in {t.name for t in req.tools or []}:
            raise InvalidRequestError(
                f"tool_choice names tool '{choice.name}', which is not in tools", param="tool_choice"
            )
        return {"type": "function", "function": {"name": choice.name}}, False
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


def chat_request(req: CountTokensRequest) -> ChatCompletionRequest:
    tools = [
        {
            "type": "function",
            "function": {
                k: v
                for k, v in {"name": t.name, "description": t.description, "parameters": t.input_schema}.items()
                if v is not None
            },
        }
        for t in req.tools or []
    ]
    tool_choice, parallel = _tool_choice(req)
    body: dict[str, Any] = {
        "model": req.model,
        "messages": chat_messages(req),
        "tools": tools or None,
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel,
    }
    if isinstance(req, MessagesRequest):
        body |= {
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "stop": req.stop_sequences or None,
            "stream": req.stream,
            "include_stop_str_in_output": bool(req.stop_sequences),
            "user": req.metadata.user_id if req.metadata else None,
        }
        if req.thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": req.thinking.type != "disabled"}
    try:
        chat = ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        raise InvalidRequestError(f"{loc}: {first.get('msg', 'invalid value')}"[:500]) from None
    chat.check()
    return chat


def cut_stop(text: str, finish_reason: str | None, stops: list[str] | None) -> tuple[str, str | None]:
    """The text without the stop sequence that ended it, and that sequence (None when none did)."""
    if finish_reason == "stop":
        for stop in stops or []:
            if text.endswith(stop):
                return text[: len(text) - len(stop)], stop
    return text, None


def tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def stop_reason(finish_reason: str | None, stop_sequence: str | None, called: bool) -> str:
    if called and finish_reason in ("stop", "tool_calls"):
        return "tool_use"
    if stop_sequence is not None:
        return "stop_sequence"
    return STOP_REASONS.get(finish_reason or "stop", "end_turn")


def usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's usage: `input_tokens` are those not read from the cache, as on Anthropic's API."""
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0  # upstreams may send null
    return {
        "input_tokens": chat_usage["prompt_tokens"] - cached,
        "output_tokens": chat_usage["completion_tokens"],
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def thinking_block(text: str) -> dict[str, Any]:
    """The model's reasoning as a thinking block. Its signature is empty: nothing here signs thinking, and replayed
    thinking blocks are not read back (the chat templates drop past reasoning)."""
    return {"type": "thinking", "thinking": text, "signature": ""}


def message_body(msg_id: str, model: str, req: MessagesRequest, chat: dict[str, Any]) -> dict[str, Any]:
    choice = chat["choices"][0]
    message = choice["message"]
    text, stop = cut_stop(message.get("content") or "", choice["finish_reason"], req.stop_sequences)
    calls = message.get("tool_calls") or []
    thought = message.get("reasoning_content")
    content: list[dict[str, Any]] = [thinking_block(thought)] if thought else []
    content += [{"type": "text", "text": text}] if text else []
    content += [
        {
            "type": "tool_use",
            "id": c["id"],
            "name": c["function"]["name"],
            "input": tool_input(c["function"]["arguments"]),
        }
        for c in calls
    ]
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(choice["finish_reason"], stop, bool(calls)),
        "stop_sequence": stop,
        "usage": usage(chat["usage"]),
    }
