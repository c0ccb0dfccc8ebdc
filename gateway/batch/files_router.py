"""OpenAI's Files API: POST /v1/files (multipart upload), GET /v1/files, GET and DELETE /v1/files/{id}, and
GET /v1/files/{id}/content.

Uploads are bounded by `--files-max-bytes` (413 past it, before the file is kept); the rest of the server's bodies
keep `--max-body-bytes`. Every answer is the caller's own files only (service.py).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse
from starlette.datastructures import FormData, UploadFile

from gateway.batch.files import MAX_LIST, check_ttl
from gateway.batch.service import owner_of, service_of
from gateway.errors import InvalidRequestError, UnsupportedMediaTypeError

router = APIRouter()

MAX_FORM_FIELDS = 16
MULTIPART_OVERHEAD = 64 * 1024  # the form's boundaries and other fields, beyond the file's own bytes


def _ttl(form: FormData) -> int | None:
    """`expires_after[anchor]` and `expires_after[seconds]`, as the openai SDK sends the nested field."""
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise InvalidRequestError("expires_after.anchor must be 'created_at'", param="expires_after.anchor")
    if not isinstance(seconds, str) or not seconds.strip().isdigit():
        raise InvalidRequestError(
            "expires_after.seconds must be a whole number of seconds", param="expires_after.seconds"
        )
    return check_ttl(int(seconds))


@router.post("/v1/files")
async def upload_file(request: Request) -> dict[str, Any]:
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise UnsupportedMediaTypeError("send the file as multipart/form-data with the fields 'file' and 'purpose'")
    async with request.form(max_files=1, max_fields=MAX_FORM_FIELDS) as form:
        upload = form.get("file")
        purpose = form.get("purpose")
        if not isinstance(upload, UploadFile):
            raise InvalidRequestError("Missing required parameter: 'file' (a file part).", param="file")
        if not isinstance(purpose, str) or not purpose:
            raise InvalidRequestError("Missing required parameter: 'purpose'.", param="purpose")
        stored = await service_of(request).files.upload(
            owner_of(request), purpose, upload.filename or "upload", upload.file, _ttl(form)
        )
    return stored.to_openai()


@router.get("/v1/files")
async def list_files(
    request: Request, purpose: str | None = None, limit: int = MAX_LIST, order: str = "desc", after: str | None = None
) -> dict[str, Any]:
    found, more = await service_of(request).files.page(owner_of(request), purpose, limit, order, after)
    return {
        "object": "list",
        "data": [f.to_openai() for f in found],
        "first_id": found[0].id if found else None,
        "last_id": found[-1].id if found else None,
        "has_more": more,
    }


@router.get("/v1/files/{file_id}")
async def retrieve_file(file_id: str, request: Request) -> dict[str, Any]:
    return (await service_of(request).files.get(file_id, owner_of(request))).to_openai()


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, request: Request) -> dict[str, Any]:
    await service_of(request).files.delete(file_id, owner_of(request))
    return {"id": file_id, "object": "file", "deleted": True}


@router.get(
    "/v1/files/{file_id}/content",
    response_class=FileResponse,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
async def file_content(file_id: str, request: Request) -> FileResponse:
    files = service_of(request).files
    stored = await files.get(file_id, owner_of(request))
    return FileResponse(files.path(stored), media_type="application/octet-stream", filename=stored.filename)
