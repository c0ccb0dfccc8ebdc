"""KV sessions on /v1: `POST /v1/sessions` issues an id, `DELETE /v1/sessions/{id}` ends one on every model.

A session starts implicitly: send `X-Session-ID: <id>` (or `"session_id"` in the body) with chat or completion
requests, and the model keeps that conversation's KV blocks pinned between turns (TTL and a memory cap apply).

Sessions belong to the API key that uses them: the id a model sees is the client's id scoped by the key's digest,
so the same id sent with another key is another session that shares no state, and deleting it with another key
finds nothing (404). Without API keys every caller is the same anonymous tenant: the id alone names the session, and
whoever knows it may continue or end it. Ids the server issues carry 128 random bits, so they cannot be guessed.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any

from fastapi import APIRouter, Request

from gateway.errors import InvalidRequestError, NotFoundError
from gateway.keys.auth import ANONYMOUS, Principal

router = APIRouter()

MAX_SESSION_ID = 256


def new_session_id() -> str:
    """An id nobody can guess: 128 bits from the operating system's CSPRNG."""
    return f"sess-{secrets.token_hex(16)}"


def scoped_session_id(request: Request, session_id: str) -> str:
    """The id the models keep for the caller's `session_id`: the id itself for anonymous callers, otherwise a
    digest of the caller's key digest and the id (fixed length, so it also fits an upstream's header limit)."""
    principal: Principal = getattr(request.state, "principal", ANONYMOUS)
    if not principal.tenant:
        return session_id
    return "k-" + hashlib.sha256(f"{principal.tenant}\0{session_id}".encode()).hexdigest()


def _check(session_id: str) -> None:
    if not 0 < len(session_id) <= MAX_SESSION_ID:
        raise InvalidRequestError(f"session id must be 1 to {MAX_SESSION_ID} characters", param="session_id")


@router.post("/v1/sessions")
async def create_session() -> dict[str, Any]:
    """An unguessable id for a new session (it starts with its first request, as any other id would)."""
    return {"id": new_session_id(), "object": "session", "created": int(time.time())}


@router.delete("/v1/sessions/{session_id}")
async def delete_session(session_id: str, request: Request) -> dict[str, Any]:
    _check(session_id)
    scoped = scoped_session_id(request, session_id)
    deleted = [m.name for m in request.app.state.registry.llms() if m.scheduler.delete_session(scoped)]
    if not deleted:
        raise NotFoundError(f"no active session '{session_id[:64]}'")
    return {"id": session_id, "object": "session", "deleted": True}
