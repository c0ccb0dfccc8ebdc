"""Anthropic's Messages API: POST /v1/messages and POST /v1/messages/count_tokens.

Same auth (a key in `x-api-key` is read as `Authorization: Bearer`), limits and metrics as /v1/chat/completions,
and errors in Anthropic's shape (gateway/errors.py picks it by path). `anthropic-version` is accepted when it is
a date, as Anthropic's clients send it; without it the current API is served.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.anthropic.convert import chat_request, message_body
from gateway.anthropic.events import events_response, message_events
from gateway.anthropic.protocol import CountTokensRequest, MessagesRequest
from gateway.errors import InvalidRequestError
from gateway.http.body_depth import NestingAwareRoute
from gateway.http.disconnect import cancel_on_disconnect
from gateway.http.ids import random_hex
from gateway.http.request_timeout import request_timeout
from gateway.http.unknown_fields import log_unknown
from gateway.openai.chat import chat_completion, chat_prompt
from gateway.repository.registry import LoadedLLM
from gateway.server.request_log import current_request_id

router = APIRouter(route_class=NestingAwareRoute)

_VERSION = re.compile(r"\d{4}-\d{2}-\d{2}")


def _check_headers(request: Request) -> dict[str, str]:
    """Refuse a malformed anthropic-version; the headers to answer with (Anthropic's `request-id`)."""
    version = request.headers.get("anthropic-version")
    if version is not None and not _VERSION.fullmatch(version.strip()):
        raise InvalidRequestError(f"anthropic-version: '{version[:32]}' is not a version date (e.g. 2023-06-01)")
    request_id = current_request_id()
    return {"request-id": request_id} if request_id else {}


async def _prompt_tokens(req: CountTokensRequest, model: LoadedLLM) -> int:
    """The prompt the chat path renders for this request, in tokens."""
    prompt, _ = await chat_prompt(chat_request(req), model)
    return len(prompt)


async def _create(req: MessagesRequest, model: LoadedLLM, timeout: float | None = None) -> dict[str, Any] | Any:
    chat = chat_request(req)
    chat.timeout = timeout  # X-Request-Timeout (Anthropic's body has no such field)
    msg_id = f"msg_{random_hex()}"
    if not req.stream:
        return message_body(msg_id, model.name, req, await chat_completion(chat, model, True))
    # an upstream used as it is counts its own prompt: its count arrives with the usage, in message_delta
    prompt_tokens = 0 if model.scheduler.passthrough is not None else await _prompt_tokens(req, model)
    chunks = await chat_completion(chat, model, True)
    start = {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model.name,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": prompt_tokens,
            "output_tokens": 0,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        },
    }
    return message_events(chunks, start, req.stop_sequences)


@router.post("/v1/messages")
async def create_message(body: MessagesRequest, request: Request) -> Response:
    headers = _check_headers(request)
    log_unknown(body, "messages")
    work = request.app.state.routes.run(
        body.model,
        request.app.state.registry.acquire_llm,  # docs/routes.md
        lambda model: _create(body, model, request_timeout(request)),
    )
    result = await cancel_on_disconnect(request, work)
    if isinstance(result, dict):
        return JSONResponse(result, headers=headers)
    response = events_response(result, request.app.state.config.stream_send_timeout_secs)
    response.headers.update(headers)
    return response


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request) -> Response:
    headers = _check_headers(request)
    tokens = await request.app.state.routes.run(
        body.model, request.app.state.registry.acquire_llm, lambda model: _prompt_tokens(body, model)
    )
    return JSONResponse({"input_tokens": tokens}, headers=headers)
