"""OpenTelemetry traces of LLM requests: optional, off unless `--otlp-traces-endpoint` is given.

A client's W3C trace context (`traceparent`, `tracestate`) is taken from each HTTP request by `TraceContextMiddleware`
and carried on the `GenerationRequest` (`trace_headers`), so the `remote` backend passes it on to its upstream.
With tracing on, each LLM request (every engine request: `n>1` makes n) gets a span `llm_request`, a child of the
client's span, with the phases as child spans: `queue` (arrival to admission), `prefill` (admission to the first
token) and `decode` (first token to the finish); the upstream then gets our span as its parent. Attributes follow
OpenTelemetry's GenAI conventions (`gen_ai.usage.input_tokens`, ...) plus vLLM's latency names.

The spans are recorded where the request metrics are (`request_metrics.py`, the one place that sees every
engine's arrival, admission, tokens and finish) and exported in batches over OTLP/HTTP by the SDK
(`pip install 'switchyard[tracing]'`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from contextvars import ContextVar
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gateway.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

log = logging.getLogger("switchyard.tracing")

TRACE_HEADERS = ("traceparent", "tracestate")

# The trace context of the HTTP request being handled (empty when the client sent none).
incoming: ContextVar[Mapping[str, str]] = ContextVar("switchyard_trace_context", default=MappingProxyType({}))

_provider: TracerProvider | None = None
_tracer: Tracer | None = None


class TraceContextMiddleware:
    """Pure ASGI: picks the client's W3C trace headers into `incoming` for the request's handler and stream."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        found = {}
        for name, value in scope.get("headers") or ():
            key = name.decode("latin-1").lower()
            if key in TRACE_HEADERS and len(value) <= 512:
                found[key] = value.decode("latin-1")
        token = incoming.set(found)
        try:
            await self.app(scope, receive, send)
        finally:
            incoming.reset(token)


def configure(endpoint: str | None, exporter: SpanExporter | None = None, service_name: str = "switchyard") -> None:
    """Turn tracing on: spans go to the OTLP/HTTP `endpoint` (e.g. http://collector:4318/v1/traces), or to
    `exporter` (tests). ConfigError when the SDK is not installed."""
    global _provider, _tracer
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        raise ConfigError(
            "--otlp-traces-endpoint needs the OpenTelemetry SDK: pip install 'switchyard[tracing]'"
        ) from None
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processor: Any = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint), schedule_delay_millis=1000)
    else:
        processor = SimpleSpanProcessor(exporter)
    shutdown()
    _provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    _provider.add_span_processor(processor)
    _tracer = _provider.get_tracer("switchyard")
    log.info("tracing LLM requests to %s", endpoint or exporter.__class__.__name__)


def shutdown() -> None:
    """Export what is buffered and turn tracing off."""
    global _provider, _tracer
    if _provider is not None:
        _provider.shutdown()
    _provider = _tracer = None


def enabled() -> bool:
    return _tracer is not None


def _wall_ns(monotonic: float, now_mono: float, now_ns: int) -> int:
    return now_ns - int((now_mono - monotonic) * 1e9)


class RequestTrace:
    """The span of one LLM request, opened at its arrival. `headers` is the trace context to pass downstream."""

    def __init__(self, carrier: Mapping[str, str], arrival: float, attributes: Mapping[str, Any]) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        assert _tracer is not None
        self._propagator = TraceContextTextMapPropagator()
        parent = self._propagator.extract(carrier=dict(carrier))
        self._clock = (time.monotonic(), time.time_ns())
        self.span = _tracer.start_span(
            "llm_request",
            context=parent,
            kind=trace.SpanKind.SERVER,
            start_time=self._ns(arrival),
            attributes=dict(attributes),
        )
        self.headers: dict[str, str] = {}
        self._propagator.inject(self.headers, context=trace.set_span_in_context(self.span))

    def _ns(self, monotonic: float) -> int:
        return _wall_ns(monotonic, *self._clock)

    def finish(
        self,
        arrival: float,
        scheduled: float | None,
        first_token: float | None,
        end: float,
        attributes: Mapping[str, Any],
        error: str | None = None,
    ) -> None:
        """Close the span at `end` (monotonic seconds, as the other times), with its phases as child spans."""
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        assert _tracer is not None
        context = trace.set_span_in_context(self.span)
        started = scheduled if scheduled is not None else end
        phases = [("queue", arrival, started)]
        if first_token is not None:
            phases += [("prefill", started, first_token), ("decode", first_token, end)]
        elif scheduled is not None:
            phases.append(("prefill", started, end))
        for name, begin, stop in phases:
            _tracer.start_span(name, context=context, start_time=self._ns(begin)).end(end_time=self._ns(stop))
        latency = {"gen_ai.latency.time_in_queue": started - arrival, "gen_ai.latency.e2e": end - arrival}
        if first_token is not None:
            latency["gen_ai.latency.time_to_first_token"] = first_token - arrival
            latency["gen_ai.latency.time_in_model_prefill"] = first_token - started
            latency["gen_ai.latency.time_in_model_decode"] = end - first_token
        self.span.set_attributes({**latency, **attributes})
        if error is not None:
            self.span.set_status(Status(StatusCode.ERROR, error[:200]))
        self.span.end(end_time=self._ns(end))
