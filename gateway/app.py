"""Builds the ASGI app: routes, error handlers in the protocols' shapes, and the model lifecycle."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, start_http_server
from starlette.exceptions import HTTPException as StarletteHTTPException

from engines.cpu_budget import cpu_budget
from gateway import __version__
from gateway.anthropic.router import router as anthropic_router
from gateway.batch.files_router import MULTIPART_OVERHEAD
from gateway.batch.files_router import router as files_router
from gateway.batch.router import router as batches_router
from gateway.batch.service import open_service as open_batch_api
from gateway.config import ServerConfig, build_rate_limiter
from gateway.errors import (
    InternalError,
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    ServiceUnavailableError,
    SwitchyardError,
    error_body,
)
from gateway.http.body_limit import BodyLimitMiddleware
from gateway.keys.admin import router as keys_admin_router
from gateway.keys.auth import KeyStore
from gateway.keys.metrics import KeyUsageCollector
from gateway.keys.rate_limit import RateLimiter
from gateway.keys.service import KeyService, open_key_service
from gateway.kserve.data_plane import DataPlane
from gateway.kserve.http import router as kserve_router
from gateway.observability import tracing
from gateway.observability.http_metrics import EndpointCountMiddleware, EndpointCounts
from gateway.observability.metrics import build_metrics_registry, render
from gateway.observability.tracing import TraceContextMiddleware
from gateway.ollama.router import root_router as ollama_root_router
from gateway.ollama.router import router as ollama_router
from gateway.openai.embeddings import router as embeddings_router
from gateway.openai.lora_admin import router as lora_admin_router
from gateway.openai.router import router as openai_router
from gateway.openai.sessions import router as sessions_router
from gateway.repository.heap import freeze_loaded
from gateway.repository.model_control import ModelControl
from gateway.repository.model_use import ModelUseMiddleware
from gateway.repository.registry import ModelRegistry
from gateway.repository.residency_metrics import ResidencyCollector
from gateway.rerank.router import router as rerank_router
from gateway.responses.router import router as responses_router
from gateway.responses.service import open_service as open_responses
from gateway.routes.config import load_routes
from gateway.routes.headers import RouteHeadersMiddleware
from gateway.routes.metrics import RouteCollector
from gateway.routes.runner import Routes
from gateway.server.access import AccessControl, AccessMiddleware
from gateway.server.lifecycle import Lifecycle
from gateway.server.request_log import RequestIdMiddleware

log = logging.getLogger("switchyard")

MAX_ERROR_CHARS = 500


def _error_response(request: Request, error: SwitchyardError) -> JSONResponse:
    path = request.url.path
    return JSONResponse(error_body(path, error), status_code=error.status_for(path), headers=error.headers)


def _validation_error(exc: RequestValidationError) -> InvalidRequestError:
    errors = exc.errors()
    if not errors:
        return InvalidRequestError("invalid request body")
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") in ("json_invalid", "json_type"):
        return InvalidRequestError("the request body is not valid JSON")
    if first.get("type") == "model_attributes_type" or not loc:
        return InvalidRequestError("the request body must be a JSON object")
    # pydantic reports union alternatives as extra path parts (e.g. "str", "list[str]"); keep the field path.
    param = ".".join(p for p in loc if not any(c in p for c in "[]") and p not in ("str", "int", "float", "bool"))
    message = str(first.get("msg", "invalid value"))[:200]
    more = f" ({len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return InvalidRequestError(f"{param}: {message}{more}"[:MAX_ERROR_CHARS], param=param or None)


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SwitchyardError)
    async def _switchyard(request: Request, exc: SwitchyardError) -> JSONResponse:
        return _error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(request, _validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            err: SwitchyardError = NotFoundError(f"no route for {request.method} {request.url.path[:200]}")
        elif exc.status_code == 405:
            err = MethodNotAllowedError(f"method {request.method} is not allowed on {request.url.path[:200]}")
        else:
            err = SwitchyardError(str(exc.detail)[:MAX_ERROR_CHARS])
            err.status = exc.status_code
            err.type = "invalid_request_error" if exc.status_code < 500 else "internal_error"
        return _error_response(request, err)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return _error_response(request, InternalError("internal server error; see the server log"))


def create_app(config: ServerConfig, control: ModelControl | None = None) -> FastAPI:
    """The app; its lifespan loads the repository (off the event loop) and starts each model's scheduler."""
    control = control or build_model_control(config)
    registry = control.models
    key_service = _key_service(config)
    keys = _key_store(config, key_service)
    lifecycle = Lifecycle()
    access = AccessControl(keys, RateLimiter(config.rate_limit_rpm, config.rate_limit_tpm), lifecycle, key_service)
    endpoint_counts = EndpointCounts()
    metrics_registry = build_metrics_registry(registry, endpoint_counts, control.rate_limiter)
    metrics_registry.register(KeyUsageCollector(key_service, config.key_metrics_by_key))
    metrics_registry.register(ResidencyCollector(control))
    app = FastAPI(
        title="Switchyard", version=__version__, lifespan=_lifespan(config, control, access, metrics_registry)
    )
    app.state.config = config
    app.state.registry = registry  # which model answers a name (every frontend)
    app.state.model_control = control  # load, unload, states (the repository API, the console)
    app.state.kserve = DataPlane(registry, control)  # KServe v2's answers, for its HTTP and gRPC codecs
    app.state.ready = False
    app.state.keys = keys
    app.state.key_service = key_service  # named keys: /admin/keys, /admin/usage
    app.state.lifecycle = lifecycle
    app.state.routes = Routes(load_routes(config.routes_file) if config.routes_file else None)  # docs/routes.md
    metrics_registry.register(RouteCollector(app.state.routes))
    add_error_handlers(app)
    _add_routes(app, config)
    _add_health_routes(app, registry, lifecycle, metrics_registry)
    _add_middleware(app, config, access, endpoint_counts)
    return app


def _key_service(config: ServerConfig) -> KeyService:
    """Named keys (docs/keys.md): the database opens at startup."""
    return open_key_service(
        config.key_store or config.cache_dir / "keys.sqlite3",
        config.key_store_url.get_secret_value() if config.key_store_url else None,
        default_rpm=config.rate_limit_rpm,
        default_tpm=config.rate_limit_tpm,
        prices=config.key_prices,
        flush_secs=config.key_usage_flush_secs,
        refresh_secs=config.key_refresh_secs,
    )


def build_model_control(config: ServerConfig) -> ModelControl:
    """The server's model control, from its settings."""
    return ModelControl(
        config.model_repository,
        config.cache_dir,
        control_mode=config.model_control_mode,
        load_models=config.load_models,
        drain_timeout_s=config.drain_seconds,
        rate_limiter=build_rate_limiter(config),
        memory_budget=None if config.memory_budget is None else int(config.memory_budget),
        keep_alive_s=config.keep_alive,
        load_timeout_s=config.load_timeout_secs,
        exit_on_error=config.exit_on_error,
        lora_dirs=config.lora_dirs,
    )


def _key_store(config: ServerConfig, named: KeyService | None = None) -> KeyStore:
    """The API and admin keys; a warning when inference is open beyond this machine."""
    keys = KeyStore(
        [k.get_secret_value() for k in config.api_keys],
        [k.get_secret_value() for k in config.admin_keys],
        config.public_paths,
        console=config.console,
        named=named,
    )
    if keys.inference_open and config.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("no API key is configured: anyone who reaches %s can run inference", config.host)
    return keys


def _lifespan(
    config: ServerConfig, control: ModelControl, access: AccessControl, metrics_registry: CollectorRegistry
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Startup: load and start the models, the metrics port, gRPC and polling; shutdown in the reverse order."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        budget = cpu_budget()  # before any engine sizes its threads from it
        log.info(
            "CPU budget: %d compute thread%s (%s)", budget.threads, "s" if budget.threads > 1 else "", budget.reason
        )
        app.state.responses = open_responses(config)
        app.state.batch_api = open_batch_api(
            config.files_dir or config.cache_dir / "files",
            control.models,
            config.files_max_bytes,
            config.batch_max_requests,
            config.batch_max_concurrency,
            lambda: not access.lifecycle.draining,
        )
        await app.state.key_service.open()
        control.residency.starting()  # requests that arrive while the startup models load wait for them
        # then models load on request and idle ones expire; only the names are kept: a copy held here for the
        # server's life would outlive its reload or unload
        served = [m.name for m in await control.start_all(await asyncio.to_thread(control.load_all))]
        await app.state.batch_api.start()  # resumes the batches a previous run left unfinished
        metrics_server = None
        if config.metrics_port:
            metrics_server, _ = start_http_server(config.metrics_port, addr=config.host, registry=metrics_registry)
        grpc_server = None
        if config.grpc_port:
            from gateway.kserve.grpc import start_grpc_server  # grpc loads only when the service is enabled

            grpc_server = await start_grpc_server(app, config.host, config.grpc_port, config.max_body_bytes, access)
        if config.model_control_mode == "poll":
            control.start_polling(config.repository_poll_secs)
        freeze_loaded()
        app.state.ready = True
        log.info(
            "Switchyard %s serving %s on http://%s:%d/v1%s",
            __version__,
            ", ".join(served) or "no model yet (they load on request)",
            config.host,
            config.http_port,
            f" and gRPC {config.host}:{config.grpc_port}" if grpc_server else "",
        )
        try:
            yield
        finally:
            if config.otlp_traces_endpoint:
                tracing.shutdown()  # export the last spans
            app.state.ready = False
            if grpc_server is not None:
                await grpc_server.stop(grace=5)
            if metrics_server is not None:
                metrics_server.shutdown()
            await app.state.responses.close()  # cancels background responses
            await app.state.batch_api.close()  # stops running batches where they are; the next start resumes them
            await app.state.key_service.close()  # writes the last usage
            await control.close()  # stop polling; replaced or unloaded copies finish
            for model in control.models.all_models():
                await model.stop()

    return lifespan


def _add_routes(app: FastAPI, config: ServerConfig) -> None:
    """The frontends: OpenAI's /v1 (with Responses), Anthropic's Messages, rerank/score, KServe's /v2, Ollama's /api,
    and the web console."""
    app.include_router(openai_router)
    app.include_router(kserve_router)
    app.include_router(embeddings_router)
    app.include_router(sessions_router)
    app.include_router(responses_router)
    app.include_router(anthropic_router)
    app.include_router(rerank_router)
    app.include_router(files_router)
    app.include_router(batches_router)
    app.include_router(keys_admin_router)
    app.include_router(ollama_router)
    app.include_router(lora_admin_router)
    if config.console:
        from gateway.console.routes import add_console

        add_console(app)  # the web console at / and /ui/ (docs/console.md)
        app.include_router(ollama_root_router)  # HEAD /, which Ollama's CLI checks the server with


def _add_health_routes(
    app: FastAPI, registry: ModelRegistry, lifecycle: Lifecycle, metrics_registry: CollectorRegistry
) -> None:
    """Probes (/health, /v2/health/*), /metrics and /version."""

    @app.get("/health")
    @app.get("/v2/health/ready")
    async def health(request: Request) -> dict[str, Any]:
        """Ready: every model in the repository is loaded and its engine is healthy."""
        if not request.app.state.ready:
            raise ServiceUnavailableError("models are loading", headers={"Retry-After": "5"})
        if lifecycle.draining:
            raise ServiceUnavailableError("the server is shutting down", headers={"Retry-After": "5"})
        failing = [m.name for m in registry.llms() if not m.scheduler.healthy]
        if failing:
            raise ServiceUnavailableError(f"engine not healthy: {', '.join(failing)}", headers={"Retry-After": "5"})
        return {"status": "ok"}

    @app.get("/v2/health/live")
    async def live() -> dict[str, Any]:
        """Live: the process answers (models may still be loading)."""
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(render(metrics_registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}


def _add_middleware(app: FastAPI, config: ServerConfig, access: AccessControl, endpoint_counts: EndpointCounts) -> None:
    """Outermost last: CORS answers preflights, then every request is counted by endpoint and gets its id, then
    access checks, then the body limit; innermost, what a route did goes into the response's headers."""
    app.add_middleware(RouteHeadersMiddleware)
    app.add_middleware(ModelUseMiddleware)  # a request holds the models it uses until its response is sent
    uploads = max(config.max_body_bytes, config.files_max_bytes + MULTIPART_OVERHEAD)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes, path_limits={"/v1/files": uploads})
    app.add_middleware(AccessMiddleware, access=access)
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(EndpointCountMiddleware, counts=endpoint_counts)
    app.add_middleware(TraceContextMiddleware)  # the client's W3C trace context, for spans and upstreams
    if config.otlp_traces_endpoint:
        tracing.configure(config.otlp_traces_endpoint)
    if config.cors_allow_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_allow_origins),
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=[
                "authorization",
                "content-type",
                "x-request-id",
                "x-session-id",
                "x-api-key",
                "anthropic-version",
            ],
            expose_headers=["x-request-id", "retry-after"],
        )
