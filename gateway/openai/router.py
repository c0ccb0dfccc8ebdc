"""/v1 routes: parse, look up the model, hand over to chat/completions; everything else lives elsewhere."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.errors import InvalidRequestError
from gateway.http.body_depth import NestingAwareRoute
from gateway.http.disconnect import cancel_on_disconnect
from gateway.http.request_timeout import request_timeout
from gateway.http.sse import sse_response
from gateway.http.unknown_fields import log_unknown
from gateway.keys import context as key_context
from gateway.openai.chat import chat_completion
from gateway.openai.completions import completion
from gateway.openai.model_cards import adapter_card, model_card, model_cards
from gateway.openai.protocol import ChatCompletionRequest, CompletionRequest
from gateway.openai.sessions import MAX_SESSION_ID, scoped_session_id
from gateway.openai.tokenize import router as tokenize_router
from gateway.repository.registry import ModelRegistry

log = logging.getLogger("switchyard.openai")

router = APIRouter(route_class=NestingAwareRoute)
router.include_router(tokenize_router)


def _registry(request: Request) -> ModelRegistry:
    return request.app.state.registry


def _route_card(name: str, request: Request) -> dict[str, Any]:
    """A route (docs/routes.md) as a model: its first target stands for it (`root`)."""
    route = request.app.state.routes.table[name]
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "switchyard",
        "root": route.targets[0].model,
        "parent": None,
        "max_model_len": None,
    }


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    """Every model a request may name, loaded or loading on request, with its `state` (model_cards.py), the LoRA
    adapters of the loaded ones and the routes (docs/routes.md); with a named key, only those it may use."""
    cards = [*model_cards(request.app.state.model_control), *map(adapter_card, _registry(request).adapters())]
    served = {c["id"] for c in cards}
    cards += [_route_card(name, request) for name in request.app.state.routes.table if name not in served]
    return {"object": "list", "data": [c for c in cards if key_context.visible(c["id"])]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    if model_id in request.app.state.routes.table and _registry(request).find(model_id) is None:
        return _route_card(model_id, request)
    return model_card(request.app.state.model_control, model_id)


def _session_id(request: Request, body: ChatCompletionRequest | CompletionRequest) -> str | None:
    """The conversation's session: the X-Session-ID header, else the body's `session_id`; scoped by the caller's
    API key (see sessions.py)."""
    header = request.headers.get("x-session-id")
    if header is None:
        return scoped_session_id(request, body.session_id) if body.session_id else body.session_id
    if not header or len(header) > MAX_SESSION_ID:
        raise InvalidRequestError(f"X-Session-ID must be 1 to {MAX_SESSION_ID} characters", param="session_id")
    return scoped_session_id(request, header)


def _respond(result: Any, request: Request) -> Response:
    # Streams were primed (first update awaited) inside the work, so queue-full and friends are HTTP errors.
    if isinstance(result, dict):
        return JSONResponse(result)
    return sse_response(result, request.app.state.config.stream_send_timeout_secs)


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    log_unknown(body, "chat.completions")
    body.check()
    body.timeout = request_timeout(request, body.timeout)
    force_usage = request.app.state.config.always_include_usage
    session_id = _session_id(request, body)
    work = request.app.state.routes.run(  # a route's models in turn (docs/routes.md), else the model itself
        body.model, _registry(request).acquire_llm, lambda model: chat_completion(body, model, force_usage, session_id)
    )
    return _respond(await cancel_on_disconnect(request, work), request)


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    log_unknown(body, "completions")
    body.check()
    body.timeout = request_timeout(request, body.timeout)
    force_usage = request.app.state.config.always_include_usage
    session_id = _session_id(request, body)
    work = request.app.state.routes.run(
        body.model, _registry(request).acquire_llm, lambda model: completion(body, model, force_usage, session_id)
    )
    return _respond(await cancel_on_disconnect(request, work), request)
