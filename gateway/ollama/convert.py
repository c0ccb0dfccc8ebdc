"""Ollama requests -> the OpenAI path's requests, so /api/chat and /api/generate answer as /v1 does.

/api/chat becomes a chat request: the model's chat template, sampling from `options`, `format` through guided
decoding (`"json"`: any JSON object; a schema: that schema), `tools` through the model's tool-call dialect, `think`
through the chat template (`enable_thinking`, and `reasoning_effort` for a level). /api/generate becomes a chat
request of its `system` and `prompt` (what Ollama's own templates make of them); with `raw` the prompt is sent as it
is, and with `template` it is first rendered by go_template.py; both then go through the completions path.

Ollama's tool calls carry their arguments as an object and may come without ids; tool results name the tool
(`tool_name`) rather than the call. Calls without an id get one here, and a result without `tool_call_id` answers
the earliest unanswered call of its tool (else the earliest unanswered call), so templates that pair results with
calls by id see them paired.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from gateway.errors import InvalidRequestError
from gateway.ollama.go_template import render_template
from gateway.ollama.lookup import unsupported
from gateway.ollama.options import read_options, sampling_fields
from gateway.ollama.protocol import ChatRequest, GenerateRequest, GenerationFields, Message, ToolCall
from gateway.openai.protocol import ChatCompletionRequest, CompletionRequest


def _no_images(name: str, where: str) -> InvalidRequestError:
    error = unsupported(name, "images: it has no vision encoder; send text")
    error.param = where
    return error


def _arguments(call: ToolCall) -> str:
    args = call.function.arguments
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def chat_messages(messages: list[Message], name: str) -> list[dict[str, Any]]:
    """Ollama messages as chat messages; images are refused (no model here has a vision encoder)."""
    out: list[dict[str, Any]] = []
    unanswered: list[tuple[str, str]] = []  # (id, tool name) of the latest assistant turn's calls
    for i, msg in enumerate(messages):
        if msg.images:
            raise _no_images(name, f"messages.{i}.images")
        if msg.role == "assistant":
            unanswered = [
                (call.id or f"call_{i}_{k}", call.function.name) for k, call in enumerate(msg.tool_calls or [])
            ]
            calls = [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": _arguments(call)}}
                for (call_id, name), call in zip(unanswered, msg.tool_calls or [], strict=True)
            ]
            item: dict[str, Any] = {"role": "assistant", "content": msg.content or ("" if not calls else None)}
            if calls:
                item["tool_calls"] = calls
        elif msg.role == "tool":
            item = {"role": "tool", "content": msg.content or ""}
            call_id = msg.tool_call_id
            if call_id is None and unanswered:
                match = next((c for c in unanswered if c[1] == msg.tool_name), unanswered[0])
                call_id = match[0]
            unanswered = [c for c in unanswered if c[0] != call_id]
            if call_id is not None:
                item["tool_call_id"] = call_id
            if msg.tool_name:
                item["name"] = msg.tool_name
        else:
            item = {"role": msg.role, "content": msg.content or ""}
        out.append(item)
    return out


def response_format(fmt: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """`format` as chat's response_format: "json" any JSON object, a schema that schema ("" or none: text)."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": fmt}}
    raise InvalidRequestError(
        f'format: "{fmt[:32]}" is not a format; use "json" or a JSON schema object', param="format"
    )


def template_kwargs(req: GenerationFields, name: str, thinks: bool) -> dict[str, Any] | None:
    """`think` for the chat template; 400 when it asks a model that does not reason to."""
    if req.think is None:
        return None
    if not thinks:
        if req.think is False:
            return None
        raise unsupported(name, "thinking")
    if isinstance(req.think, str):  # a level: models that read one (gpt-oss) take it as reasoning_effort
        return {"enable_thinking": True, "reasoning_effort": req.think}
    return {"enable_thinking": req.think}


def _common(req: GenerationFields, max_model_len: int | None) -> dict[str, Any]:
    if req.logprobs:
        raise InvalidRequestError(
            "logprobs are not served on the Ollama API here; use /v1/chat/completions", param="logprobs"
        )
    # max_tokens stays when None (no num_predict): completions would otherwise stop at its default of 16 tokens
    return {
        "stream": True,
        "response_format": response_format(req.format),
        "max_tokens": None,
        **sampling_fields(read_options(req.options), max_model_len),
    }


def _validated(kind: type[ChatCompletionRequest] | type[CompletionRequest], body: dict[str, Any]) -> Any:
    try:
        request = kind.model_validate({k: v for k, v in body.items() if v is not None or k == "max_tokens"})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        raise InvalidRequestError(f"{loc}: {first.get('msg', 'invalid value')}"[:500]) from None
    request.check()
    return request


def chat_request(req: ChatRequest, served: str, max_model_len: int | None, thinks: bool) -> ChatCompletionRequest:
    """/api/chat as a streamed chat request for the model served as `served`."""
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    body = {
        "model": served,
        "messages": chat_messages(req.messages, req.model),
        "tools": tools or None,
        "chat_template_kwargs": template_kwargs(req, req.model, thinks),
        **_common(req, max_model_len),
    }
    return _validated(ChatCompletionRequest, body)


def generate_request(
    req: GenerateRequest, served: str, max_model_len: int | None, thinks: bool
) -> ChatCompletionRequest | CompletionRequest:
    """/api/generate as a streamed chat request (a raw or templated prompt: a completions request)."""
    if req.images:
        raise _no_images(req.model, "images")
    if req.suffix:
        raise unsupported(req.model, "insert")  # no fill-in-the-middle here
    if req.raw and (req.template or req.system or req.context):
        raise InvalidRequestError("raw mode does not support template, system, or context", param="raw")
    if req.context:
        raise InvalidRequestError(
            "context (deprecated on Ollama) is not supported here; send the conversation to /api/chat", param="context"
        )
    kwargs = template_kwargs(req, req.model, thinks)  # checked in every mode; read by the chat template only
    if req.raw or req.template:
        prompt = req.prompt if req.raw else render_template(req.template or "", req.system or "", req.prompt)
        return _validated(CompletionRequest, {"model": served, "prompt": prompt, **_common(req, max_model_len)})
    messages = [{"role": "system", "content": req.system}] if req.system else []
    messages.append({"role": "user", "content": req.prompt})
    return _validated(
        ChatCompletionRequest,
        {"model": served, "messages": messages, "chat_template_kwargs": kwargs, **_common(req, max_model_len)},
    )
