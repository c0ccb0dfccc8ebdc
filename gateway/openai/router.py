"""/v1 routes: parse, look up the model, hand over to chat/completions; everything else lives elsewhere."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.openai.chat import chat_completion
from gateway.openai.completions import completion
from gateway.openai.disconnect import cancel_on_disconnect
from gateway.openai.protocol import ChatCompletionRequest, CompletionRequest, _Lenient
from gateway.openai.sse import sse_response
from gateway.repository.registry import LoadedModel, ModelRegistry

log = logging.getLogger("switchyard.openai")

router = APIRouter()


def _registry(request: Request) -> ModelRegistry:
    return request.app.state.registry


def _log_unknown(body: _Lenient, route: str) -> None:
    if body.model_extra:
        log.info("%s: ignoring unknown fields %s", route, sorted(body.model_extra)[:20])


def _model_card(m: LoadedModel) -> dict[str, Any]:
    return {
        "id": m.name,
        "object": "model",
        "created": m.created,
        "owned_by": m.config.owned_by,
        "root": m.name,
        "parent": None,
        "max_model_len": m.scheduler.info.max_model_len,
    }


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(m) for m in _registry(request).models()]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    return _model_card(_registry(request).get(model_id))


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    _log_unknown(body, "chat.completions")
    model = _registry(request).get(body.model)
    force_usage = request.app.state.config.always_include_usage
    if body.stream:
        return sse_response(await chat_completion(body, model, force_usage))  # type: ignore[arg-type]
    return JSONResponse(await cancel_on_disconnect(request, chat_completion(body, model, force_usage)))


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    _log_unknown(body, "completions")
    model = _registry(request).get(body.model)
    force_usage = request.app.state.config.always_include_usage
    if body.stream:
        return sse_response(await completion(body, model, force_usage))  # type: ignore[arg-type]
    return JSONResponse(await cancel_on_disconnect(request, completion(body, model, force_usage)))
