"""KServe v2 over HTTP (Triton's routes): metadata, readiness, config, infer (JSON and binary tensors), LLM
generate / generate_stream, statistics and the repository API.

Errors are `SwitchyardError`s; the app renders them as `{"error": "..."}` with Triton's statuses on /v2 paths.
Health (`/v2/health/live|ready`) lives in app.py.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.errors import InvalidRequestError, SwitchyardError
from gateway.http.body_depth import has_lone_surrogate
from gateway.http.disconnect import cancel_on_disconnect
from gateway.http.sse import EventStream
from gateway.kserve import llm_bridge
from gateway.kserve.codec import (
    HEADER_LENGTH_HEADER,
    InputTensor,
    TensorCodecError,
    build_infer_response,
    decode_json_tensor,
    parse_infer_request,
)
from gateway.kserve.data_plane import DataPlane
from gateway.repository.loaded_model import LoadedLLM, LoadedTensorModel

log = logging.getLogger("switchyard.kserve")
router = APIRouter()


def _plane(request: Request) -> DataPlane:
    return request.app.state.kserve


async def _json_body(request: Request, default: Any = None) -> Any:
    raw = await _body(request)
    if not raw.strip():
        return default
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidRequestError("the request body is not valid JSON") from None
    if has_lone_surrogate(raw, doc):
        raise InvalidRequestError("the request body is not valid JSON: it holds an unpaired UTF-16 surrogate")
    return doc


async def _body(request: Request) -> bytes:
    """The body, decompressed when the client used Content-Encoding gzip/deflate (bounded by the body limit)."""
    raw = await request.body()
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding not in ("gzip", "deflate"):
        raise InvalidRequestError(f"Content-Encoding '{encoding[:20]}' is not supported; use gzip, deflate or none")
    limit = request.app.state.config.max_body_bytes
    try:
        inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
        out = inflater.decompress(raw, limit + 1)
    except zlib.error:
        raise InvalidRequestError(f"the body is not valid {encoding} data") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise InvalidRequestError(f"the decompressed body exceeds the limit of {limit} bytes")
    return out


# ---------------------------------------------------------------- server and model metadata


@router.get("/v2")
async def server_metadata() -> dict[str, Any]:
    return DataPlane.server_metadata()


@router.get("/v2/models/stats")  # before /v2/models/{name}, which would take "stats" for a model name
async def all_stats(request: Request) -> dict[str, Any]:
    return {"model_stats": _plane(request).statistics()}


@router.get("/v2/models/{name}")
@router.get("/v2/models/{name}/versions/{version}")
async def model_metadata(name: str, request: Request, version: str | None = None) -> dict[str, Any]:
    return _plane(request).model_metadata(name, version)


@router.get("/v2/models/{name}/ready")
@router.get("/v2/models/{name}/versions/{version}/ready")
async def model_ready(name: str, request: Request, version: str | None = None) -> Response:
    _plane(request).model(name, version)  # 404 when not ready
    return Response(status_code=200)


@router.get("/v2/models/{name}/config")
@router.get("/v2/models/{name}/versions/{version}/config")
async def model_config(name: str, request: Request, version: str | None = None) -> dict[str, Any]:
    return _plane(request).model_config(name, version)


# ---------------------------------------------------------------- inference


@router.post("/v2/models/{name}/infer")
@router.post("/v2/models/{name}/versions/{version}/infer")
async def infer(name: str, request: Request, version: str | None = None) -> Response:
    plane = _plane(request)
    await plane.serving(name, version)  # an unknown model is a 404 before the body is read (loads on request)
    body = await _body(request)
    try:
        parsed = parse_infer_request(body, request.headers.get(HEADER_LENGTH_HEADER))
    except TensorCodecError as exc:
        raise InvalidRequestError(str(exc)) from None
    for out in parsed.outputs:
        if "classification" in out.parameters:
            raise InvalidRequestError("the classification extension is not supported")
    wanted = [o.name for o in parsed.outputs]
    served, outputs = await cancel_on_disconnect(
        request, plane.infer(name, version, parsed.inputs, wanted, parsed.parameters)
    )
    try:
        payload, header_length = build_infer_response(name, outputs, request=parsed, model_version=served)
    except TensorCodecError as exc:
        raise InvalidRequestError(str(exc)) from None
    if header_length is None:
        return Response(payload, media_type="application/json")
    return Response(payload, media_type="application/octet-stream", headers={HEADER_LENGTH_HEADER: str(header_length)})


async def _tensor_generate(model: LoadedTensorModel, body: Any, version: str | None) -> AsyncIterator[dict[str, Any]]:
    """Triton's generate on a tensor model: top-level fields named like inputs become tensors, outputs come back
    as fields (a single element as a scalar)."""
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    tensor_model = model.tensor
    entry = tensor_model.version(version)
    batched = tensor_model.config.max_batch_size > 0
    declared = {s.name: s for s in entry.inputs}
    inputs = []
    for key, value in body.items():
        if key in ("parameters", "id"):
            continue
        spec = declared.get(key)
        if spec is None:
            raise InvalidRequestError(
                f"unexpected field '{key[:64]}'; model '{model.name}' takes {', '.join(declared)}"
            )
        data = value if isinstance(value, list) else [value]
        shape = ([1] if batched else []) + [len(data)]
        try:
            tensor = decode_json_tensor({"name": key, "datatype": spec.datatype, "shape": shape, "data": data})
        except TensorCodecError as exc:
            raise InvalidRequestError(str(exc)) from None
        inputs.append(InputTensor(key, spec.datatype, tensor.array))
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidRequestError("'parameters' must be a JSON object")
    async for served, outputs in tensor_model.infer_stream(inputs, (), version, parameters):
        doc: dict[str, Any] = {"model_name": model.name, "model_version": str(served.version)}
        for out in outputs:
            values = np.asarray(out.array).ravel().tolist()
            values = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in values]
            doc[out.name] = values[0] if len(values) == 1 else values
        yield doc


@router.post("/v2/models/{name}/generate")
@router.post("/v2/models/{name}/versions/{version}/generate")
async def generate(name: str, request: Request, version: str | None = None) -> dict[str, Any]:
    model = await _plane(request).serving(name, version)
    body = await _json_body(request)
    if isinstance(model, LoadedTensorModel):

        async def collect() -> list[dict[str, Any]]:
            return [doc async for doc in _tensor_generate(model, body, version)]

        docs = await cancel_on_disconnect(request, collect())
        if len(docs) != 1:
            raise InvalidRequestError(f"model '{name}' sent {len(docs)} responses; use generate_stream")
        return docs[0]
    assert isinstance(model, LoadedLLM)
    prompt, values = llm_bridge.generate_body(body)

    async def run() -> str:
        return "".join([d async for d in llm_bridge.generate_text(model, prompt, values)])

    text = await cancel_on_disconnect(request, run())
    return {"model_name": name, "model_version": "1", llm_bridge.TEXT_OUTPUT: text}


@router.post("/v2/models/{name}/generate_stream")
@router.post("/v2/models/{name}/versions/{version}/generate_stream")
async def generate_stream(name: str, request: Request, version: str | None = None) -> Response:
    model = await _plane(request).serving(name, version)
    body = await _json_body(request)
    if isinstance(model, LoadedTensorModel):
        docs = _tensor_generate(model, body, version)
    else:
        assert isinstance(model, LoadedLLM)
        prompt, values = llm_bridge.generate_body(body)
        docs = _llm_docs(model, name, prompt, values)
    first = await _first(docs)  # errors before the first event get a proper status
    return EventStream(_events(first, docs), request.app.state.config.stream_send_timeout_secs)


async def _llm_docs(model: LoadedLLM, name: str, prompt: str, values: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    async for delta in llm_bridge.generate_text(model, prompt, values):
        yield {"model_name": name, "model_version": "1", llm_bridge.TEXT_OUTPUT: delta}


async def _first(docs: AsyncIterator[dict[str, Any]]) -> dict[str, Any] | None:
    try:
        return await docs.__anext__()
    except StopAsyncIteration:
        return None


async def _events(first: dict[str, Any] | None, docs: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, str]]:
    if first is None:
        return
    yield {"data": json.dumps(first, separators=(",", ":"))}
    try:
        async for doc in docs:
            yield {"data": json.dumps(doc, separators=(",", ":"))}
    except SwitchyardError as exc:
        yield {"data": json.dumps(exc.kserve_body())}
    except Exception:
        log.exception("generate_stream failed after it started")
        yield {"data": json.dumps({"error": "the stream failed; see the server log"})}


# ---------------------------------------------------------------- statistics


@router.get("/v2/models/{name}/stats")
@router.get("/v2/models/{name}/versions/{version}/stats")
async def model_stats(name: str, request: Request, version: str | None = None) -> dict[str, Any]:
    return {"model_stats": _plane(request).statistics(name, version)}


# ---------------------------------------------------------------- repository


@router.post("/v2/repository/index")
async def repository_index(request: Request) -> JSONResponse:
    body = await _json_body(request, {})
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    ready = body.get("ready", False)
    if not isinstance(ready, bool):
        raise InvalidRequestError("'ready' must be true or false")
    return JSONResponse(_plane(request).repository_index(ready_only=ready))


def _load_parameters(body: Any) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    params = body.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidRequestError("'parameters' must be a JSON object")
    return params


@router.post("/v2/repository/models/{name:path}/load")
async def repository_load(name: str, request: Request) -> Response:
    await _plane(request).load(name, _load_parameters(await _json_body(request)))
    return Response(status_code=200)


@router.post("/v2/repository/models/{name:path}/unload")
async def repository_unload(name: str, request: Request) -> Response:
    await _plane(request).unload(name, _load_parameters(await _json_body(request)))
    return Response(status_code=200)
