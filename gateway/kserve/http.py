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

from gateway import __version__
from gateway.errors import InvalidRequestError, NotFoundError, SwitchyardError
from gateway.http.body_depth import has_lone_surrogate
from gateway.http.disconnect import cancel_on_disconnect
from gateway.http.sse import EventStream
from gateway.kserve import llm_bridge
from gateway.kserve.codec import (
    HEADER_LENGTH_HEADER,
    InputTensor,
    OutputTensor,
    TensorCodecError,
    build_infer_response,
    decode_json_tensor,
    parse_infer_request,
)
from gateway.repository.registry import LoadedModel, ModelRegistry

log = logging.getLogger("switchyard.kserve")
router = APIRouter()

EXTENSIONS = [
    "binary_tensor_data", "model_configuration", "model_repository", "schedule_policy", "statistics", "generate",
    "sequence",
]


def _registry(request: Request) -> ModelRegistry:
    return request.app.state.registry


def _model(request: Request, name: str) -> LoadedModel:
    return _registry(request).get(name)


def _check_version(model: LoadedModel, version: str | None) -> None:
    if model.tensor is not None:
        model.tensor.version(version)
    elif version not in (None, "", "1"):
        raise NotFoundError(f"model '{model.name}' has no version '{str(version)[:40]}'")


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
    return {"name": "switchyard", "version": __version__, "extensions": EXTENSIONS}


@router.get("/v2/models/stats")  # before /v2/models/{name}, which would take "stats" for a model name
async def all_stats(request: Request) -> dict[str, Any]:
    return {"model_stats": [s for m in _registry(request).all_models() for s in _stats(m, None)]}


@router.get("/v2/models/{name}")
@router.get("/v2/models/{name}/versions/{version}")
async def model_metadata(name: str, request: Request, version: str | None = None) -> dict[str, Any]:
    model = _model(request, name)
    if model.tensor is not None:
        return model.tensor.metadata(version)
    _check_version(model, version)
    return llm_bridge.llm_metadata(model)


@router.get("/v2/models/{name}/ready")
@router.get("/v2/models/{name}/versions/{version}/ready")
async def model_ready(name: str, request: Request, version: str | None = None) -> Response:
    model = _model(request, name)
    _check_version(model, version)
    return Response(status_code=200)


@router.get("/v2/models/{name}/config")
@router.get("/v2/models/{name}/versions/{version}/config")
async def model_config(name: str, request: Request, version: str | None = None) -> dict[str, Any]:
    model = _model(request, name)
    if model.tensor is not None:
        return model.tensor.config_json(version)
    _check_version(model, version)
    return llm_bridge.llm_config(model)


# ---------------------------------------------------------------- inference


@router.post("/v2/models/{name}/infer")
@router.post("/v2/models/{name}/versions/{version}/infer")
async def infer(name: str, request: Request, version: str | None = None) -> Response:
    model = _model(request, name)
    body = await _body(request)
    try:
        parsed = parse_infer_request(body, request.headers.get(HEADER_LENGTH_HEADER))
    except TensorCodecError as exc:
        raise InvalidRequestError(str(exc)) from None
    for out in parsed.outputs:
        if "classification" in out.parameters:
            raise InvalidRequestError("the classification extension is not supported")
    wanted = [o.name for o in parsed.outputs]
    if model.tensor is not None:
        entry, outputs = await cancel_on_disconnect(
            request, model.tensor.infer(parsed.inputs, wanted, version, parsed.parameters)
        )
        served = str(entry.version)
    else:
        _check_version(model, version)
        prompt, values, _stream = llm_bridge.infer_values(parsed.inputs, parsed.parameters)
        if wanted and wanted != [llm_bridge.TEXT_OUTPUT]:
            raise InvalidRequestError(f"model '{name}' has only the output '{llm_bridge.TEXT_OUTPUT}'")

        async def run() -> str:
            return "".join([d async for d in llm_bridge.generate_text(model, prompt, values)])

        text = await cancel_on_disconnect(request, run())
        outputs = [OutputTensor(llm_bridge.TEXT_OUTPUT, llm_bridge.text_tensor(text), "BYTES")]
        served = "1"
    try:
        payload, header_length = build_infer_response(name, outputs, request=parsed, model_version=served)
    except TensorCodecError as exc:
        raise InvalidRequestError(str(exc)) from None
    if header_length is None:
        return Response(payload, media_type="application/json")
    return Response(payload, media_type="application/octet-stream", headers={HEADER_LENGTH_HEADER: str(header_length)})


def _generate_model(request: Request, name: str, version: str | None) -> LoadedModel:
    model = _model(request, name)
    _check_version(model, version)
    return model


async def _tensor_generate(model: LoadedModel, body: Any, version: str | None) -> AsyncIterator[dict[str, Any]]:
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
    model = _generate_model(request, name, version)
    body = await _json_body(request)
    if model.tensor is not None:
        async def collect() -> list[dict[str, Any]]:
            return [doc async for doc in _tensor_generate(model, body, version)]

        docs = await cancel_on_disconnect(request, collect())
        if len(docs) != 1:
            raise InvalidRequestError(f"model '{name}' sent {len(docs)} responses; use generate_stream")
        return docs[0]
    prompt, values = llm_bridge.generate_body(body)

    async def run() -> str:
        return "".join([d async for d in llm_bridge.generate_text(model, prompt, values)])

    text = await cancel_on_disconnect(request, run())
    return {"model_name": name, "model_version": "1", llm_bridge.TEXT_OUTPUT: text}


@router.post("/v2/models/{name}/generate_stream")
@router.post("/v2/models/{name}/versions/{version}/generate_stream")
async def generate_stream(name: str, request: Request, version: str | None = None) -> Response:
    model = _generate_model(request, name, version)
    body = await _json_body(request)
    if model.tensor is not None:
        docs = _tensor_generate(model, body, version)
    else:
        prompt, values = llm_bridge.generate_body(body)
        docs = _llm_docs(model, name, prompt, values)
    first = await _first(docs)  # errors before the first event get a proper status
    return EventStream(_events(first, docs), request.app.state.config.stream_send_timeout_secs)


async def _llm_docs(
    model: LoadedModel, name: str, prompt: str, values: dict[str, Any]
) -> AsyncIterator[dict[str, Any]]:
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


def _stats(model: LoadedModel, version: str | None) -> list[dict[str, Any]]:
    if model.tensor is None:
        _check_version(model, version)
        return [model.scheduler.stats().requests.model_stats.as_dict(model.name, "1")]
    if version not in (None, ""):
        entry = model.tensor.version(version)
        return [entry.stats.as_dict(model.name, str(entry.version))]
    return [e.stats.as_dict(model.name, str(v)) for v, e in sorted(model.tensor.versions.items())]


@router.get("/v2/models/{name}/stats")
@router.get("/v2/models/{name}/versions/{version}/stats")
async def model_stats(name: str, request: Request, version: str | None = None) -> dict[str, Any]:
    return {"model_stats": _stats(_model(request, name), version)}


# ---------------------------------------------------------------- repository


@router.post("/v2/repository/index")
async def repository_index(request: Request) -> JSONResponse:
    body = await _json_body(request, {})
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    ready = body.get("ready", False)
    if not isinstance(ready, bool):
        raise InvalidRequestError("'ready' must be true or false")
    return JSONResponse(_registry(request).index(ready_only=ready))


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
    params = _load_parameters(await _json_body(request))
    files = [k for k in params if k.startswith("file:")]
    if files:
        raise InvalidRequestError("model files cannot be sent over the network ('file:' parameters are not supported)")
    unknown = [k for k in params if k != "config"]
    if unknown:
        raise InvalidRequestError(f"unknown load parameter '{unknown[0][:64]}'; only 'config' is supported")
    override = None
    if "config" in params:
        raw = params["config"]
        try:
            override = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            raise InvalidRequestError("parameters.config must be a JSON object (as a string)") from None
        if not isinstance(override, dict):
            raise InvalidRequestError("parameters.config must be a JSON object")
    await _registry(request).load(name, override)
    return Response(status_code=200)


@router.post("/v2/repository/models/{name:path}/unload")
async def repository_unload(name: str, request: Request) -> Response:
    params = _load_parameters(await _json_body(request))
    unknown = [k for k in params if k != "unload_dependents"]
    if unknown:
        raise InvalidRequestError(f"unknown unload parameter '{unknown[0][:64]}'")
    await _registry(request).unload(name)
    return Response(status_code=200)
