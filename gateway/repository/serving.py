"""Hand-over between two copies of a model, so a reload or an unload drops no request.

A model copy counts the requests it is serving (`InFlight`). When a reload replaces it, new requests that still
reach the old copy (they looked the model up just before the swap) are forwarded to its successor; the old copy
stops only once its own requests have finished (or a drain timeout has passed). When an unload removes it, new
requests are refused with 503 while the running ones finish. `ServingScheduler` adds this to any LLM scheduler;
tensor models do it in `TensorModel.infer` with the same `InFlight`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from engines.interface import Tokenizer
from engines.types import EngineInfo, GenerationOutput, GenerationRequest
from gateway.errors import ServiceUnavailableError
from gateway.scheduler.llm.interface import LLMEngine, LLMScheduler, Passthrough, SchedulerStats
from gateway.server.lifecycle import InFlightCount


class InFlight(InFlightCount):
    """Requests running on one model copy, and where new ones go once the copy is retired."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.successor: Any = None  # the copy that replaced this one (a reload)
        self.closed = False  # retired: no new request starts here

    def retire(self, successor: Any = None) -> None:
        self.successor = successor
        self.closed = True

    def enter(self) -> None:
        if self.closed:
            raise ServiceUnavailableError(f"model '{self.name}' is unloading", headers={"Retry-After": "5"})
        super().enter()


class ServingScheduler(LLMScheduler):
    """An LLM scheduler that counts its requests and hands new ones to a successor after a reload.

    Everything else (stats, sessions, health, the engine) is the wrapped scheduler's."""

    def __init__(self, inner: LLMScheduler, name: str) -> None:
        self.inner = inner
        self.in_flight = InFlight(name)

    @property
    def info(self) -> EngineInfo:
        return self.inner.info

    @property
    def tokenizer(self) -> Tokenizer:
        return self.inner.tokenizer

    @property
    def engine(self) -> LLMEngine:
        return self.inner.engine

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationOutput, None]:
        successor = self.in_flight.successor
        if successor is not None:
            async with contextlib.aclosing(successor.generate(request)) as stream:
                async for out in stream:
                    yield out
            return
        self.in_flight.enter()
        try:
            async with contextlib.aclosing(self.inner.generate(request)) as stream:  # closing early aborts it
                async for out in stream:
                    yield out
        finally:
            self.in_flight.leave()

    def stats(self) -> SchedulerStats:
        return self.inner.stats()

    def delete_session(self, session_id: str) -> bool:
        return self.inner.delete_session(session_id)

    @property
    def healthy(self) -> bool:
        return self.inner.healthy

    @property
    def passthrough(self) -> Passthrough | None:
        successor = self.in_flight.successor
        if successor is not None:
            return successor.passthrough
        inner = self.inner.passthrough
        return None if inner is None else _CountedPassthrough(inner, self.in_flight)


class _CountedPassthrough(Passthrough):
    """A passthrough model's calls counted as this copy's requests, so a reload or unload waits for them."""

    def __init__(self, inner: Passthrough, in_flight: InFlight) -> None:
        self._inner = inner
        self._in_flight = in_flight

    @property
    def upstream_model(self) -> str:
        return self._inner.upstream_model

    async def call(
        self, endpoint: str, body: dict[str, Any], priority: int = 0, timeout: float | None = None
    ) -> dict[str, Any]:
        self._in_flight.enter()
        try:
            return await self._inner.call(endpoint, body, priority, timeout)
        finally:
            self._in_flight.leave()

    async def stream(
        self, endpoint: str, body: dict[str, Any], priority: int = 0, timeout: float | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        self._in_flight.enter()
        try:
            chunks = await self._inner.stream(endpoint, body, priority, timeout)
        except BaseException:
            self._in_flight.leave()
            raise
        return self._counted(chunks)

    async def _counted(self, chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        try:
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    yield chunk
        finally:
            self._in_flight.leave()
