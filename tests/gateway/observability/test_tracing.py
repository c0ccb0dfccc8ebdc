"""Tracing of LLM requests with the OpenTelemetry SDK's in-memory exporter: the span of a request, its phases,
its parent taken from the client's traceparent, and the context handed downstream. The engine's stream is a
scripted async generator; a real server exporting over OTLP is tests/e2e/test_tracing_otlp.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from engines.types import GenerationOutput, GenerationRequest, SamplingParams
from gateway.observability import tracing
from gateway.observability.request_metrics import LLMRequestStats

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    tracing.configure(None, exporter=memory)
    yield memory
    tracing.shutdown()


def request(rid: str = "r1") -> GenerationRequest:
    return GenerationRequest(rid, [1, 2, 3, 4], SamplingParams(max_tokens=3, temperature=0.0))


async def engine(
    stats: LLMRequestStats, req: GenerationRequest, seen: list[dict[str, str]], fail: bool = False
) -> AsyncIterator[GenerationOutput]:
    seen.append(dict(req.trace_headers))  # what a remote engine would send upstream
    await asyncio.sleep(0.01)  # queued
    stats.scheduled(req.request_id)  # as a scheduler does on admission
    await asyncio.sleep(0.02)  # prefill
    if fail:
        raise RuntimeError("the engine broke")
    for i in range(3):
        await asyncio.sleep(0.01)
        yield GenerationOutput(req.request_id, [10 + i], "x", prompt_tokens=4, completion_tokens=i + 1)
    yield GenerationOutput(
        req.request_id,
        [],
        "",
        finished=True,
        finish_reason="length",
        prompt_tokens=4,
        completion_tokens=3,
        cached_prompt_tokens=2,
    )


async def run(stats: LLMRequestStats, req: GenerationRequest, seen: list, fail: bool = False) -> None:
    token = tracing.incoming.set({"traceparent": TRACEPARENT, "tracestate": "vendor=1"})
    try:
        async for _ in stats.observe(req, engine(stats, req, seen, fail)):
            pass
    finally:
        tracing.incoming.reset(token)


async def test_a_request_is_a_span_with_its_phases_under_the_clients_span(exporter: InMemorySpanExporter) -> None:
    seen: list[dict[str, str]] = []
    await run(LLMRequestStats(), request(), seen)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"llm_request", "queue", "prefill", "decode"}
    root = spans["llm_request"]
    assert root.kind == SpanKind.SERVER
    assert f"{root.context.trace_id:032x}" == CLIENT_TRACE and f"{root.parent.span_id:016x}" == CLIENT_SPAN
    for name in ("queue", "prefill", "decode"):
        assert spans[name].parent.span_id == root.context.span_id
        assert spans[name].context.trace_id == root.context.trace_id
    queue, prefill, decode = spans["queue"], spans["prefill"], spans["decode"]
    assert root.start_time == queue.start_time <= queue.end_time == prefill.start_time
    assert prefill.end_time == decode.start_time <= decode.end_time == root.end_time
    assert queue.end_time - queue.start_time >= 5_000_000  # the 10 ms before admission
    assert prefill.end_time - prefill.start_time >= 15_000_000  # the 20 ms before the first token
    attrs = root.attributes
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (4, 3)
    assert attrs["gen_ai.usage.cached_input_tokens"] == 2
    assert tuple(attrs["gen_ai.response.finish_reasons"]) == ("length",)
    assert attrs["gen_ai.request.max_tokens"] == 3 and attrs["gen_ai.latency.time_to_first_token"] > 0
    assert root.status.status_code != StatusCode.ERROR
    # Downstream sees our span as the parent, in the same trace, with the client's tracestate.
    (headers,) = seen
    assert headers["traceparent"] == f"00-{CLIENT_TRACE}-{root.context.span_id:016x}-01"
    assert headers["tracestate"] == "vendor=1"


async def test_a_failed_request_ends_its_span_with_an_error(exporter: InMemorySpanExporter) -> None:
    with pytest.raises(RuntimeError):
        await run(LLMRequestStats(), request("r2"), [], fail=True)
    (root,) = [s for s in exporter.get_finished_spans() if s.name == "llm_request"]
    assert root.status.status_code == StatusCode.ERROR and "the engine broke" in root.status.description
    assert "decode" not in {s.name for s in exporter.get_finished_spans()}


async def test_without_tracing_the_clients_context_is_passed_on_unchanged() -> None:
    assert not tracing.enabled()
    seen: list[dict[str, str]] = []
    await run(LLMRequestStats(), request("r3"), seen)
    assert seen == [{"traceparent": TRACEPARENT, "tracestate": "vendor=1"}]


def test_configure_without_the_sdk_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_sdk(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("opentelemetry.sdk"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sdk)
    with pytest.raises(tracing.ConfigError, match=r"switchyard\[tracing\]"):
        tracing.configure("http://127.0.0.1:4318/v1/traces")
