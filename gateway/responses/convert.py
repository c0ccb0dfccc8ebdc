"""Responses <-> chat: a Responses request becomes a chat request, a chat answer becomes output items.

The chat path does the work (chat template, sampling, guided decoding for `text.format` and forced tools, the
model's tool-call dialect), so both endpoints give the same answer for the same conversation. The conversation a
stored response continues is kept as chat messages (`history`); `instructions` are not part of it (OpenAI does
not carry them over to a continued response).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from gateway.errors import InvalidRequestError, SwitchyardError
from gateway.http.ids import random_hex
from gateway.openai.protocol import ChatCompletionRequest
from gateway.responses.protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionToolChoice,
    MessageItem,
    ResponsesRequest,
    TextPart,
)

# Chat's field names in errors -> the Responses field the user sent.
PARAMS = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
    "tools": "tools",
    "tool_choice": "tool_choice",
}


def item_id(prefix: str) -> str:
    return f"{prefix}_{random_hex()}"


def _parts_text(parts: str | list[TextPart], where: str) -> str:
    if isinstance(parts, str):
        return parts
    texts = []
    for i, part in enumerate(parts):
        text = part.text if part.type != "refusal" else part.refusal
        if text is None:
            raise InvalidRequestError(f"{where}.content.{i} needs its text", param=f"{where}.content")
        texts.append(text)
    return "\n".join(texts)


def input_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's `input` as chat messages (consecutive function calls join one assistant message)."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(req.input or []):
        where = f"input.{i}"
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": _parts_text(item.content, where)})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _parts_text(item.output, where)})
    return messages


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        raise InvalidRequestError("text.format of type json_schema needs a schema", param="text.format.schema")
    schema = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict, "description": fmt.description}
    return {"type": "json_schema", "json_schema": {k: v for k, v in schema.items() if v is not None}}


def _tool_choice(req: ResponsesRequest) -> Any:
    choice = req.tool_choice
    if isinstance(choice, FunctionToolChoice):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


def chat_request(req: ResponsesRequest, conversation: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request for this response: instructions, then the conversation (earlier turns and the new input)."""
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages = [*system, *conversation]
    if not messages:
        raise InvalidRequestError("input is required", param="input")
    tools = [
        {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True, by_alias=True)}
        for t in req.tools or []
    ]
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "seed": req.seed,
        "top_k": req.top_k,
        "priority": req.priority,
        "tools": tools or None,
        "tool_choice": _tool_choice(req),
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": _response_format(req),
        "stream": req.stream,
        "user": req.user,
        "timeout": req.timeout,
    }
    try:
        chat = ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        raise InvalidRequestError(f"{loc}: {first.get('msg', 'invalid value')}"[:500], param="input") from None
    chat.check()
    return chat


def renamed(error: SwitchyardError) -> SwitchyardError:
    """A chat error with its `param` renamed to the Responses field."""
    if error.param is not None:
        head, _, rest = error.param.partition(".")
        if head in PARAMS:
            error.param = PARAMS[head] + (f".{rest}" if rest else "")
    return error


def message_item(text: str, status: str = "completed", msg_id: str | None = None) -> dict[str, Any]:
    return {
        "type": "message",
        "id": msg_id or item_id("msg"),
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def function_call_item(
    call_id: str, name: str, arguments: str, status: str = "completed", fc_id: str | None = None
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": fc_id or item_id("fc"),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def reasoning_item(text: str, status: str = "completed", rs_id: str | None = None) -> dict[str, Any]:
    """The model's reasoning (`reasoning_content` of the chat answer) as a reasoning item, its text in full."""
    return {
        "type": "reasoning",
        "id": rs_id or item_id("rs"),
        "summary": [],
        "status": status,
        "content": [{"type": "reasoning_text", "text": text}],
        "encrypted_content": None,
    }


def item_status(finish_reason: str | None, last: bool) -> str:
    """An output item's status: the last one is `incomplete` when the output cap cut it."""
    return "incomplete" if last and finish_reason == "length" else "completed"


def output_items(message: dict[str, Any], finish_reason: str | None = None) -> list[dict[str, Any]]:
    """A chat answer's message as output items: its reasoning, its text (if any, or if there is nothing else), then
    its calls."""
    calls = message.get("tool_calls") or []
    text = message.get("content") or ""
    thought = message.get("reasoning_content")
    items = [reasoning_item(thought)] if thought else []
    items += [message_item(text)] if text or not (calls or thought) else []
    items += [function_call_item(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls]
    if items:
        items[-1]["status"] = item_status(finish_reason, True)
    return items


def history_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output items as the chat messages a continuation replays (one assistant message)."""
    text = "".join(p["text"] for item in output if item["type"] == "message" for p in item["content"])
    calls = [
        {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
        for item in output
        if item["type"] == "function_call"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return [message]


def usage(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if chat_usage is None:
        return None
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {  # an upstream used as it is may send the details as null
            "cached_tokens": (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        },
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage.get("total_tokens") or chat_usage["prompt_tokens"] + chat_usage["completion_tokens"],
    }


def incomplete_details(finish_reason: str | None) -> dict[str, Any] | None:
    return {"reason": "max_output_tokens"} if finish_reason == "length" else None


def response_object(
    resp_id: str,
    created: int,
    req: ResponsesRequest,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    usage_: dict[str, Any] | None = None,
    incomplete: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """OpenAI's Response object, echoing the request's settings."""
    fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else None
    return {
        "id": resp_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": req.background,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": req.store,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": {"format": fmt or {"type": "text"}},
        "tool_choice": (
            req.tool_choice.model_dump()
            if isinstance(req.tool_choice, FunctionToolChoice)
            else req.tool_choice or ("auto" if req.tools else "none")
        ),
        "tools": [t.model_dump(by_alias=True, exclude_none=True) for t in req.tools or []],
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "truncation": req.truncation or "disabled",
        "usage": usage_,
        "user": req.user,
        "metadata": req.metadata or {},
    }
