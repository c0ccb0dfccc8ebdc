"""The admin API of named keys and their usage (behind the admin key, as /v2/repository):

POST   /admin/keys                 create; the answer holds the secret, shown this once
GET    /admin/keys                 list (revoked keys too, with their status)
GET    /admin/keys/{id}            one key
PATCH  /admin/keys/{id}            change its name, metadata or policy (only the fields given)
POST   /admin/keys/{id}/rotate     a new secret for the same key; the old one stops working
DELETE /admin/keys/{id}            revoke: refused from now on, still listed with its usage
GET    /admin/usage                usage per key and model: ?key=&model=&from=&to=&group_by=&format=csv
"""

from __future__ import annotations

import asyncio
import csv
import io
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import ValidationError

from gateway.errors import InvalidRequestError
from gateway.keys.policy import KeyCreate, KeyRecord, KeyUpdate
from gateway.keys.service import KeyService
from gateway.keys.store import HOUR, UsageCounts

router = APIRouter(prefix="/admin", tags=["admin"])

DAY = 86400
CSV_COLUMNS = (
    "key_id",
    "key_name",
    "model",
    "start",
    "requests",
    "errors",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "total_tokens",
    "cost",
)


def _service(request: Request) -> KeyService:
    return request.app.state.key_service


def _now(request: Request) -> float:
    return _service(request).now()


def _created(request: Request, key: KeyRecord, secret: str) -> dict[str, Any]:
    return key.public(_now(request)) | {"secret": secret}


@router.post("/keys")
async def create_key(body: KeyCreate, request: Request) -> dict[str, Any]:
    key, secret = await _service(request).create(body)
    return _created(request, key, secret)


@router.get("/keys")
async def list_keys(request: Request) -> dict[str, Any]:
    now = _now(request)
    return {"object": "list", "data": [k.public(now) for k in _service(request).keys()]}


@router.get("/keys/{key_id}")
async def get_key(key_id: str, request: Request) -> dict[str, Any]:
    return _service(request).get(key_id).public(_now(request))


@router.patch("/keys/{key_id}")
async def update_key(key_id: str, body: KeyUpdate, request: Request) -> dict[str, Any]:
    try:
        key = await _service(request).update(key_id, body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"])
        raise InvalidRequestError(f"{param}: {first['msg']}", param=param or None) from None
    return key.public(_now(request))


@router.post("/keys/{key_id}/rotate")
async def rotate_key(key_id: str, request: Request) -> dict[str, Any]:
    key, secret = await _service(request).rotate(key_id)
    return _created(request, key, secret)


@router.delete("/keys/{key_id}")
async def revoke_key(key_id: str, request: Request) -> dict[str, Any]:
    return (await _service(request).revoke(key_id)).public(_now(request))


def _time(value: str | None, name: str) -> float | None:
    """A Unix time in seconds, or an ISO 8601 date or date-time (UTC unless it names its offset)."""
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequestError(
            f"'{name}' must be a Unix time or an ISO 8601 date such as 2026-01-31 or 2026-01-31T12:00:00Z", param=name
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


@router.get("/usage")
async def usage(
    request: Request,
    key: str | None = Query(None, description="a key's id or name"),
    model: str | None = None,
    start: str | None = Query(None, alias="from", description="Unix time or ISO 8601; usage is kept per UTC hour"),
    end: str | None = Query(None, alias="to", description="Unix time or ISO 8601 (exclusive)"),
    group_by: Literal["key_model", "hour", "day"] = Query("key_model", description="totals, or per hour or day"),
    format: Literal["json", "csv"] = Query("json"),  # noqa: A002 - the query parameter's name
) -> Response:
    """Requests, errors and tokens per key and model, written at most --key-usage-flush-secs ago (this replica's
    latest counts are written first)."""
    service = _service(request)
    begin, finish = _time(start, "from"), _time(end, "to")
    key_ids = None
    if key is not None:
        key_ids = [k.id for k in service.named(key)] or [key]  # a revoked-and-purged id still has usage rows
    await service.ledger.flush(service.keys())
    assert service.db is not None
    rows = await asyncio.to_thread(service.db.usage_rows, key_ids, model, begin, finish)
    grouped: dict[tuple[str, str, int | None], UsageCounts] = {}
    for key_id, model_name, hour, counts in rows:
        when = None if group_by == "key_model" else hour if group_by == "hour" else hour // DAY * DAY
        total = grouped.setdefault((key_id, model_name, when), UsageCounts())
        total.add(counts)
    names = {k.id: k for k in service.keys()}
    data = []
    for (key_id, model_name, when), counts in sorted(grouped.items(), key=lambda item: (item[0][2] or 0, item[0])):
        record = names.get(key_id)
        row: dict[str, Any] = {"key_id": key_id, "key_name": record.name if record else None, "model": model_name}
        if when is not None:
            row["start"] = when
        data.append(row | counts.as_dict() | {"metadata": record.metadata if record else {}})
    if format == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(data)
        return Response(
            out.getvalue(),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": 'attachment; filename="usage.csv"'},
        )
    body = {"object": "list", "from": begin, "to": finish, "group_by": group_by, "bucket_seconds": HOUR, "data": data}
    return Response(orjson.dumps(body), media_type="application/json")
