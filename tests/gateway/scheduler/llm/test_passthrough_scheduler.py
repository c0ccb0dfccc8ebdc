"""The scheduler of an upstream used as it is: admission, request metrics from the upstream's bodies, and the
upstream's errors as the gateway's (a scripted engine; the real upstreams are in tests/e2e/test_passthrough.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from engines.interface import PassthroughEngine, UpstreamError, UpstreamTimeoutError, UpstreamUnreachableError
from engines.types import EngineInfo
from gateway.errors import (
    BadGatewayError,
    GatewayTimeoutError,
    InvalidRequestError,
    OverloadedError,
    PayloadTooLargeError,
    RateLimitError,
    ServiceUnavailableError,
    SwitchyardError,
    UpstreamConnectionError,
)
from gateway.repository.model_config import SchedulerConfig
from gateway.scheduler.llm.passthrough import PassthroughScheduler, gateway_error

USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def chunk(content: str | None = None, finish: str | None = None, usage: dict | None = None) -> dict[str, Any]:  # type: ignore[type-arg]
    choices = [] if usage else [{"index": 0, "delta": {"content": content} if content else {}, "finish_reason": finish}]
    return {"object": "chat.completion.chunk", "choices": choices, **({"usage": usage} if usage else {})}


class ScriptedUpstream(PassthroughEngine):
    def __init__(self) -> None:
        self.gate: asyncio.Event | None = None
        self.fail: BaseException | None = None  # raised before the answer
        self.fail_after: int | None = None  # chunks sent before a failure
        self.bodies: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0

    @property
    def info(self) -> EngineInfo:
        return EngineInfo("openai", "upstream", 0, 0, [])

    @property
    def upstream_model(self) -> str:
        return "their-name"

    async def _enter(self, body: dict[str, Any]) -> None:
        self.bodies.append(body)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail

    async def request(self, endpoint: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        try:
            await self._enter(body)
            return {
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}],
                "usage": USAGE,
            }
        finally:
            self.in_flight -= 1

    async def stream(
        self, endpoint: str, body: dict[str, Any], headers: dict[str, str]
    ) -> AsyncIterator[dict[str, Any]]:
        try:
            await self._enter(body)
            for i, piece in enumerate([chunk(), chunk("Hel"), chunk("lo"), chunk(finish="stop"), chunk(usage=USAGE)]):
                if self.fail_after is not None and i == self.fail_after:
                    raise UpstreamUnreachableError("http://up/v1 failed (ServerDisconnectedError)")
                yield piece
        finally:
            self.in_flight -= 1


async def started(upstream: ScriptedUpstream, **limits: int) -> PassthroughScheduler:
    scheduler = PassthroughScheduler(upstream, "ours", SchedulerConfig(**limits))
    await scheduler.start()
    return scheduler


async def test_a_call_returns_the_upstreams_answer_and_counts_its_usage() -> None:
    upstream = ScriptedUpstream()
    scheduler = await started(upstream)
    answer = await scheduler.call("chat/completions", {"model": "their-name"})
    assert answer["choices"][0]["message"]["content"] == "hi"
    stats = scheduler.stats().requests
    assert (stats.prompt_tokens, stats.generation_tokens, stats.finished) == (7, 3, {"stop": 1})


async def test_a_stream_is_primed_and_passes_every_chunk() -> None:
    scheduler = await started(ScriptedUpstream())
    chunks = await scheduler.stream("chat/completions", {"stream": True})
    got = [c async for c in chunks]
    assert [c["choices"][0]["delta"].get("content") for c in got[:4]] == [None, "Hel", "lo", None]
    assert got[-1]["usage"] == USAGE
    stats = scheduler.stats().requests
    assert stats.ttft.count == 1 and stats.generation_tokens == 3 and stats.finished == {"stop": 1}


async def test_a_failure_before_the_first_chunk_is_an_http_error() -> None:
    upstream = ScriptedUpstream()
    upstream.fail = UpstreamUnreachableError("http://up/v1 failed (ClientConnectorError)")
    scheduler = await started(upstream)
    with pytest.raises(UpstreamConnectionError, match="ClientConnectorError"):
        await scheduler.stream("chat/completions", {"stream": True})
    assert scheduler.stats().running == 0


async def test_a_failure_mid_stream_ends_the_chunks_with_the_error() -> None:
    upstream = ScriptedUpstream()
    upstream.fail_after = 2
    scheduler = await started(upstream)
    chunks = await scheduler.stream("chat/completions", {"stream": True})
    got = []
    with pytest.raises(UpstreamConnectionError):
        async for c in chunks:
            got.append(c)
    assert len(got) == 2 and scheduler.stats().running == 0


async def test_requests_beyond_max_num_seqs_wait_and_a_full_queue_refuses() -> None:
    upstream = ScriptedUpstream()
    upstream.gate = asyncio.Event()
    scheduler = await started(upstream, max_num_seqs=2, max_queue_size=1)
    calls = [asyncio.create_task(scheduler.call("chat/completions", {})) for _ in range(3)]
    await asyncio.sleep(0.01)
    assert (upstream.in_flight, scheduler.stats().running, scheduler.stats().waiting) == (2, 2, 1)
    with pytest.raises(RateLimitError, match="queue is full"):
        await scheduler.call("chat/completions", {})
    upstream.gate.set()
    await asyncio.gather(*calls)
    assert upstream.max_in_flight == 2


async def test_a_request_waiting_past_its_own_timeout_is_refused_and_counted() -> None:
    upstream = ScriptedUpstream()
    upstream.gate = asyncio.Event()
    scheduler = await started(upstream, max_num_seqs=1)
    holder = asyncio.create_task(scheduler.call("chat/completions", {}))
    await asyncio.sleep(0.01)
    with pytest.raises(OverloadedError, match=r"waited 0\.05 s") as err:
        await scheduler.stream("chat/completions", {"stream": True}, timeout=0.05)
    assert err.value.reason == "queue_timeout" and err.value.headers["Retry-After"].isdigit()
    stats = scheduler.stats()
    assert (stats.waiting, stats.rejected, len(upstream.bodies)) == (0, {"queue_timeout": 1}, 1)
    upstream.gate.set()
    await holder  # the running request was never touched


async def test_no_tokenizer_is_a_clear_400() -> None:
    scheduler = await started(ScriptedUpstream())
    with pytest.raises(InvalidRequestError, match="no tokenizer here"):
        scheduler.tokenizer.encode("hello")


async def test_a_stopped_model_refuses() -> None:
    scheduler = await started(ScriptedUpstream())
    await scheduler.stop()
    with pytest.raises(ServiceUnavailableError):
        await scheduler.call("chat/completions", {})


@pytest.mark.parametrize(
    ("error", "kind", "status"),
    [
        (UpstreamError(400, "temperature: too high", param="temperature"), InvalidRequestError, 400),
        (UpstreamError(422, "messages: field required"), InvalidRequestError, 400),
        (UpstreamError(401, "invalid api key"), BadGatewayError, 502),
        (UpstreamError(404, "model 'x' not found"), BadGatewayError, 502),
        (UpstreamError(408, "request timeout"), GatewayTimeoutError, 504),
        (UpstreamError(413, "too large"), PayloadTooLargeError, 413),
        (UpstreamError(429, "slow down", retry_after=2), RateLimitError, 429),
        (UpstreamError(500, "CUDA error"), BadGatewayError, 502),
        (UpstreamError(503, "loading model"), ServiceUnavailableError, 503),
        (UpstreamTimeoutError("no answer"), GatewayTimeoutError, 504),
        (UpstreamUnreachableError("refused"), UpstreamConnectionError, 502),
    ],
)
def test_upstream_errors_map_onto_the_gateways(error: Exception, kind: type[SwitchyardError], status: int) -> None:
    mapped = gateway_error(error)
    assert type(mapped) is kind and mapped.status == status
    if isinstance(error, UpstreamError):
        assert error.message in mapped.message
    if error.__class__ is UpstreamError and error.status == 429:
        assert mapped.headers["Retry-After"] == "2"
    if error.__class__ is UpstreamError and error.status == 400:
        assert mapped.param == "temperature"
