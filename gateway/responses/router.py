"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel.

Same auth, limits, metrics and error shape as /v1/chat/completions: the routes sit behind the same middleware and
every answer goes through the model's scheduler, whatever its backend.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.errors import InvalidRequestError
from gateway.http.body_depth import NestingAwareRoute
from gateway.http.disconnect import cancel_on_disconnect
from gateway.http.request_timeout import request_timeout
from gateway.http.unknown_fields import log_unknown
from gateway.keys.auth import ANONYMOUS
from gateway.responses.events import events_response
from gateway.responses.protocol import MAX_ID, ResponsesRequest
from gateway.responses.service import ResponsesService

router = APIRouter(route_class=NestingAwareRoute)


def _service(request: Request) -> ResponsesService:
    return request.app.state.responses


def _owner(request: Request) -> str:
    """Who is calling (the key's fingerprint; "anonymous" without keys): stored responses are theirs alone."""
    return getattr(request.state, "principal", ANONYMOUS).key_id


def _checked_id(resp_id: str) -> str:
    if not 0 < len(resp_id) <= MAX_ID:
        raise InvalidRequestError(f"response ids are 1 to {MAX_ID} characters", param="response_id")
    return resp_id


@router.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    log_unknown(body, "responses")
    body.timeout = request_timeout(request, body.timeout)
    service, owner = _service(request), _owner(request)
    work = request.app.state.routes.run(
        body.model,
        request.app.state.registry.acquire_llm,  # docs/routes.md
        lambda model: service.create(body, model, owner),
    )
    # A background response outlives its request; any other is aborted when its client goes away.
    result = await (work if body.background else cancel_on_disconnect(request, work))
    if isinstance(result, dict):
        return JSONResponse(result)
    return events_response(result, request.app.state.config.stream_send_timeout_secs)


@router.get("/v1/responses/{response_id}", response_model=None)
async def get_response(
    response_id: str, request: Request, stream: bool = False, starting_after: int = -1
) -> dict[str, Any] | Response:
    """The response; with `stream=true`, a running background stream's events after `starting_after`."""
    if not stream:
        return await _service(request).get(_checked_id(response_id), _owner(request))
    events = await _service(request).follow(_checked_id(response_id), _owner(request), starting_after)
    return events_response(events, request.app.state.config.stream_send_timeout_secs)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    return await _service(request).delete(_checked_id(response_id), _owner(request))


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request) -> dict[str, Any]:
    return await _service(request).cancel(_checked_id(response_id), _owner(request))
