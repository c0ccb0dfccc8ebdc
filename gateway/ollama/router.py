"""Ollama's API: /api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags, /api/show, /api/ps,
/api/version, and the model-management routes, which answer that models come from the model repository.

Same auth (API keys as `Authorization: Bearer`, as Ollama's clients send `OLLAMA_API_KEY`), limits and metrics as
/v1; errors in Ollama's shape `{"error": "..."}` (gateway/errors.py picks it by path). `HEAD /` answers 200 as Ollama's
server does, where the web console serves `GET /` (with `--no-console`, `/` is not served at all).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.background import BackgroundTask

from gateway.errors import InvalidRequestError, NotFoundError, PermissionDeniedError
from gateway.http.body_depth import NestingAwareRoute
from gateway.http.disconnect import cancel_on_disconnect
from gateway.http.ndjson import MEDIA_TYPE, NDJSONResponse, ndjson_line
from gateway.http.unknown_fields import log_unknown
from gateway.keys.auth import ANONYMOUS, Principal
from gateway.ollama.catalog import ps_entry, show_body, tag_entry, thinks
from gateway.ollama.convert import chat_request, generate_request
from gateway.ollama.embed import embed_prompt, embed_texts, embedder
from gateway.ollama.keep_alive import control_refusal, load_folder, parse_keep_alive, unload_after
from gateway.ollama.listing import Listed, find_listed, listed_models
from gateway.ollama.lookup import LATEST, OllamaModelNotFoundError, acquire, find, text_model
from gateway.ollama.model_facts import Facts, read_facts, read_folder_facts
from gateway.ollama.options import read_options
from gateway.ollama.protocol import (
    ChatRequest,
    CopyRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    ModelRequest,
)
from gateway.ollama.replies import Shape, TextReader, Timer, stream_chunks, whole_body
from gateway.openai.chat import chat_completion
from gateway.openai.chat_pieces import ChatReader
from gateway.openai.completions import completion
from gateway.openai.protocol import ChatCompletionRequest, CompletionRequest
from gateway.repository.loaded_model import LoadedLLM, LoadedModel
from gateway.repository.model_control import ModelControl
from gateway.repository.registry import ModelRegistry

#: The Ollama release whose API this frontend follows (clients compare it to the version a feature needs);
#: Switchyard's own version is at /version.
OLLAMA_VERSION = "0.33.0"
RUNNING = "Ollama is running"
REPOSITORY = (
    "models come from this server's model repository (a folder with a config file per model), not from a registry"
)

router = APIRouter(route_class=NestingAwareRoute)
root_router = APIRouter()  # HEAD / beside the web console's page


def _registry(request: Request) -> ModelRegistry:
    return request.app.state.registry


def _control(request: Request) -> ModelControl:
    return request.app.state.model_control


def _principal(request: Request) -> Principal:
    return getattr(request.state, "principal", ANONYMOUS)


async def _facts(request: Request, item: Listed) -> Facts:
    root = _control(request).root
    if item.entry is not None:
        return await asyncio.to_thread(read_facts, root, item.entry)
    return await asyncio.to_thread(read_folder_facts, root, item.folder, item.config)


def _listed(request: Request, name: str) -> Listed:
    """The model `name` names, loaded or not (never loaded by this lookup); Ollama's 404 otherwise."""
    item = find_listed(_control(request), name)
    if item is None:
        raise OllamaModelNotFoundError(name)
    return item


# ---------------------------------------------------------------------- server


@root_router.head("/", include_in_schema=False)
async def running() -> Response:
    """Ollama's CLI checks its server with HEAD /; GET / stays the console's page (404 with --no-console)."""
    return PlainTextResponse(RUNNING)


@router.get("/api/version")
async def version() -> dict[str, str]:
    return {"version": OLLAMA_VERSION}


# ---------------------------------------------------------------------- models


@router.get("/api/tags")
async def tags(request: Request) -> dict[str, Any]:
    """Every model a request may name, loaded or loading on request (Ollama's local models)."""
    items = listed_models(_control(request))
    facts = await asyncio.gather(*(_facts(request, item) for item in items))
    return {"models": [tag_entry(item.name, f) for item, f in zip(items, facts, strict=True)]}


@router.get("/api/ps")
async def ps(request: Request) -> dict[str, Any]:
    """The loaded models, each with when it unloads if no request comes."""
    items = [item for item in listed_models(_control(request)) if item.entry is not None]
    facts = await asyncio.gather(*(_facts(request, item) for item in items))
    expiry = _control(request).residency.expiry
    return {
        "models": [
            ps_entry(item.entry, f, expiry.seconds_left(item.folder))
            for item, f in zip(items, facts, strict=True)
            if item.entry is not None
        ]
    }


def _target(body: ModelRequest) -> str:
    if not body.target:
        raise InvalidRequestError("model is required", param="model")
    return body.target


@router.post("/api/show")
async def show(body: ModelRequest, request: Request) -> dict[str, Any]:
    """A model's details, from its config and files: a model that is not loaded stays so, as on Ollama."""
    item = _listed(request, _target(body))
    return show_body(item, await _facts(request, item))


@router.post("/api/pull")
async def pull(body: ModelRequest, request: Request) -> Response:
    """A model that is served is there already: success, as Ollama answers a pull of a model it has."""
    name = _target(body)
    if find_listed(_control(request), name) is None:
        raise NotFoundError(
            f"model '{name[:256]}' not found, and it cannot be pulled: {REPOSITORY}; add it there", param="model"
        )
    status = {"status": "success"}
    if body.stream is False:
        return JSONResponse(status)
    return Response(ndjson_line(status), media_type=MEDIA_TYPE)


def _not_here(what: str) -> PermissionDeniedError:
    return PermissionDeniedError(f"{what} is not supported: {REPOSITORY}")


@router.post("/api/push")
async def push(body: ModelRequest) -> Response:
    _target(body)
    raise _not_here("push")


@router.post("/api/create")
async def create(body: ModelRequest) -> Response:
    _target(body)
    raise _not_here("create")


@router.delete("/api/delete")
async def delete(body: ModelRequest, request: Request) -> Response:
    _listed(request, _target(body))
    raise _not_here("delete (remove the model's folder from the repository, or unload it with the repository API)")


@router.post("/api/copy")
async def copy(body: CopyRequest, request: Request) -> Response:
    _listed(request, body.source)
    raise _not_here("copy (to serve a model under another name, set served_model_name in its config)")


# ---------------------------------------------------------------------- generation


async def _load_or_unload(request: Request, name: str, keep: float | None, shape: Shape, route: str) -> Response:
    """Ollama's load request (no prompt or messages) and unload request (the same with keep_alive 0). A model that
    loads on request is loaded, or unloaded once this answer is sent (keep_alive 0), by the residency manager; the
    others through the repository API's rules (keep_alive.py)."""
    control, principal, registry = _control(request), _principal(request), _registry(request)
    model = find(registry, name)
    if keep == 0:
        if model is None and control.catalog.requestable(name.removesuffix(LATEST)) is None:
            raise OllamaModelNotFoundError(name)
        if model is not None and control.catalog.loads_on_request(model.folder):
            await acquire(registry, name, keep)  # held until this answer is sent, then idle past keep-alive 0
        elif model is not None:
            refusal = control_refusal(control, principal)
            if refusal is not None:
                raise PermissionDeniedError(f"model '{name[:256]}' was not unloaded: {refusal}")
            await control.unload(model.folder)
        reason = "unload"
    else:
        try:
            model = await acquire(registry, name, keep)
        except OllamaModelNotFoundError:
            model = await load_folder(control, name.removesuffix(LATEST), principal)
            if model is None:
                raise
        text_model(model, name, route)
        reason = "load"
    return JSONResponse({**shape.part(), "done": True, "done_reason": reason})


def _unload_task(request: Request, model: LoadedModel, keep: float | None) -> BackgroundTask | None:
    """keep_alive 0: unload the model once the answer is sent (keep_alive.py says when that is allowed); a model
    that loads on request is unloaded by the residency manager once the request lets it go."""
    if keep != 0 or _control(request).catalog.loads_on_request(model.folder):
        return None
    return BackgroundTask(unload_after, _control(request), model, _principal(request))


async def _answer(
    request: Request,
    model: LoadedLLM,
    req: ChatCompletionRequest | CompletionRequest,
    shape: Shape,
    keep_thinking: bool,
    timer: Timer,
    streamed: bool,
    keep: float | None,
) -> Response:
    """Run the request on the OpenAI path and answer in Ollama's shape."""

    async def start() -> ChatReader | TextReader:
        timer.submitted = Timer.now()
        if isinstance(req, ChatCompletionRequest):
            chunks = await chat_completion(req, model, True)
        else:
            chunks = await completion(req, model, True)
        assert not isinstance(chunks, dict)  # streamed: the requests are built with stream true
        timer.first = Timer.now()  # the stream is primed: its first token is out
        return ChatReader(chunks) if isinstance(req, ChatCompletionRequest) else TextReader(chunks)

    reader = await cancel_on_disconnect(request, start())
    background = _unload_task(request, model, keep)
    if streamed:
        return NDJSONResponse(
            stream_chunks(reader, shape, keep_thinking, timer),
            request.app.state.config.stream_send_timeout_secs,
            background,
        )
    body = await cancel_on_disconnect(request, whole_body(reader, shape, keep_thinking, timer))
    return JSONResponse(body, background=background)


@router.post("/api/chat")
async def chat(body: ChatRequest, request: Request) -> Response:
    timer = Timer()
    log_unknown(body, "ollama chat")
    keep = parse_keep_alive(body.keep_alive)
    shape = Shape(True, body.model)
    if not body.messages:
        return await _load_or_unload(request, body.model, keep, shape, "chat")
    model = text_model(await acquire(_registry(request), body.model, keep), body.model, "chat")
    timer.loaded = Timer.now()
    req = chat_request(body, model.name, model.max_model_len, thinks(model))
    return await _answer(request, model, req, shape, body.think is not False, timer, body.streamed, keep)


@router.post("/api/generate")
async def generate(body: GenerateRequest, request: Request) -> Response:
    timer = Timer()
    log_unknown(body, "ollama generate")
    keep = parse_keep_alive(body.keep_alive)
    shape = Shape(False, body.model)
    if not body.prompt:
        return await _load_or_unload(request, body.model, keep, shape, "generate")
    model = text_model(await acquire(_registry(request), body.model, keep), body.model, "generate")
    timer.loaded = Timer.now()
    req = generate_request(body, model.name, model.max_model_len, thinks(model))
    return await _answer(request, model, req, shape, body.think is not False, timer, body.streamed, keep)


# ---------------------------------------------------------------------- embeddings


def _json(body: dict[str, Any], background: BackgroundTask | None) -> Response:
    # orjson writes float32 arrays directly (see gateway/openai/embeddings.py)
    return Response(
        orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json", background=background
    )


@router.post("/api/embed")
async def embed(body: EmbedRequest, request: Request) -> Response:
    timer = Timer()
    log_unknown(body, "ollama embed")
    keep = parse_keep_alive(body.keep_alive)
    read_options(body.options)  # checked; embedding models have no sampling
    model = embedder(await acquire(_registry(request), body.model, keep), body.model)
    timer.loaded = Timer.now()
    vectors, tokens = await cancel_on_disconnect(
        request, embed_texts(model, body.input, body.truncate, body.dimensions)
    )
    return _json(
        {
            "model": body.model,
            "embeddings": vectors,
            "total_duration": Timer.now() - timer.start,
            "load_duration": timer.loaded - timer.start,
            "prompt_eval_count": tokens,
        },
        _unload_task(request, model, keep),
    )


@router.post("/api/embeddings")
async def embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    log_unknown(body, "ollama embeddings")
    keep = parse_keep_alive(body.keep_alive)
    read_options(body.options)
    model = embedder(await acquire(_registry(request), body.model, keep), body.model)
    vector = await cancel_on_disconnect(request, embed_prompt(model, body.prompt))
    return _json({"embedding": vector}, _unload_task(request, model, keep))
