"""OpenAI's Batch API: POST /v1/batches, GET /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.batch.service import BatchCreateRequest, owner_of, service_of
from gateway.http.body_depth import NestingAwareRoute
from gateway.http.unknown_fields import log_unknown

router = APIRouter(route_class=NestingAwareRoute)


@router.post("/v1/batches")
async def create_batch(body: BatchCreateRequest, request: Request) -> dict[str, Any]:
    log_unknown(body, "batches")
    return await service_of(request).create(body, owner_of(request))


@router.get("/v1/batches")
async def list_batches(request: Request, after: str | None = None, limit: int = 20) -> dict[str, Any]:
    return await service_of(request).page(owner_of(request), limit, after)


@router.get("/v1/batches/{batch_id}")
async def retrieve_batch(batch_id: str, request: Request) -> dict[str, Any]:
    return await service_of(request).get(batch_id, owner_of(request))


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request) -> dict[str, Any]:
    return await service_of(request).cancel(batch_id, owner_of(request))
