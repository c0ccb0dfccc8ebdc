"""DELETE /v1/sessions/{id}: end a stateful KV session on every model that holds it.

A session starts implicitly: send `X-Session-ID: <id>` (or `"session_id"` in the body) with chat or completion
requests, and the model keeps that conversation's KV blocks pinned between turns (TTL and a memory cap apply).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.errors import InvalidRequestError, NotFoundError

router = APIRouter()


@router.delete("/v1/sessions/{session_id}")
async def delete_session(session_id: str, request: Request) -> dict[str, Any]:
    if not 0 < len(session_id) <= 256:
        raise InvalidRequestError("session id must be 1 to 256 characters", param="session_id")
    deleted = [m.name for m in request.app.state.registry.models() if m.scheduler.delete_session(session_id)]
    if not deleted:
        raise NotFoundError(f"no active session '{session_id[:64]}'")
    return {"id": session_id, "object": "session", "deleted": True}
