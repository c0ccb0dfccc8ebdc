"""Admission control in front of engines that batch internally (vLLM, TensorRT-LLM, remote upstreams).

Those engines schedule their own steps, so the gateway does not build batches for them. It decides *which* requests
enter the engine and *when*: at most `scheduler.max_num_seqs` at once (beyond that the engine would only queue them
itself, where our priorities cannot reach), waiting requests ordered by (priority, arrival) with aging, a bounded
queue (429 beyond it), and a stream that aborts its engine request when the client goes away (the iterator is
closed). Engine failures become the gateway's errors: a bad request 400, an unavailable engine 503 (and the model
reports not ready), a failure mid-stream a final update with finish_reason "error" or "abort".

Session affinity is the engine's business (a remote engine pins a session to one upstream); this scheduler passes
`session_id` through and forwards `delete_session`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from engines.interface import AsyncGenerateEngine, EngineUnavailableError, Tokenizer
from engines.types import EngineInfo, GenerationOutput, GenerationRequest
from gateway.errors import InvalidRequestError, RateLimitError, ServiceUnavailableError
from gateway.repository.model_config import SchedulerConfig
from gateway.scheduler.llm.interface import LLMScheduler, SchedulerStats, admission_key

log = logging.getLogger("switchyard.scheduler.admission")


@dataclass
class _Ticket:
    request: GenerationRequest
    order: int
    granted: asyncio.Future[None]

    def sort_key(self, now: float, aging_seconds: float) -> tuple[float, int]:
        return admission_key(self.request, self.order, now, aging_seconds)


class AdmissionQueue:
    """At most `max_num_seqs` requests in at once; the others wait in (priority, arrival) order with aging, at
    most `max_queue_size` of them (429 beyond). Shared by the schedulers of engines that batch internally and of
    upstreams used as they are (passthrough.py)."""

    def __init__(self, limits: SchedulerConfig) -> None:
        self._limits = limits
        self._waiting: list[_Ticket] = []
        self._slots_used = 0
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def check_room(self) -> None:
        if len(self._waiting) >= self._limits.max_queue_size:
            raise RateLimitError("the model's queue is full; retry shortly", headers={"Retry-After": "1"})

    def fail_waiting(self, error: BaseException) -> None:
        for ticket in self._waiting:
            if not ticket.granted.done():
                ticket.granted.set_exception(error)
        self._waiting.clear()

    async def acquire(self, request: GenerationRequest) -> None:
        if self._slots_used < self._limits.max_num_seqs and not self._waiting:
            self._slots_used += 1
            return
        ticket = _Ticket(request, next(self._order), asyncio.get_running_loop().create_future())
        self._waiting.append(ticket)
        try:
            await ticket.granted
        except BaseException:
            if ticket in self._waiting:
                self._waiting.remove(ticket)
            elif ticket.granted.done() and not ticket.granted.cancelled() and ticket.granted.exception() is None:
                self.release()  # granted a slot in the same tick the caller went away: hand it on
            raise

    def release(self) -> None:
        self._slots_used -= 1
        self._dispatch()

    def _dispatch(self) -> None:
        now = time.monotonic()
        aging = self._limits.aging_seconds
        while self._waiting and self._slots_used < self._limits.max_num_seqs:
            ticket = min(self._waiting, key=lambda t: t.sort_key(now, aging))
            self._waiting.remove(ticket)
            if ticket.granted.done():  # its caller gave up already
                continue
            self._slots_used += 1
            ticket.granted.set_result(None)


class AdmissionScheduler(LLMScheduler):
    def __init__(self, engine: AsyncGenerateEngine, scheduler: SchedulerConfig | None = None) -> None:
        """`scheduler`: the model config's section (`max_num_seqs` requests inside the engine at once)."""
        self._engine = engine
        self._limits = scheduler or SchedulerConfig()
        self._queue = AdmissionQueue(self._limits)
        self._active: set[str] = set()
        self._started = False
        self._stats = SchedulerStats()

    # -- LLMScheduler -------------------------------------------------------------------------------------------
    @property
    def info(self) -> EngineInfo:
        return self._engine.info

    @property
    def tokenizer(self) -> Tokenizer:
        return self._engine.tokenizer

    @property
    def engine(self) -> AsyncGenerateEngine:
        return self._engine

    @property
    def healthy(self) -> bool:
        return self._started and self._engine.healthy

    async def start(self) -> None:
        await self._engine.start()
        self._started = True

    async def stop(self) -> None:
        self._started = False
        self._queue.fail_waiting(ServiceUnavailableError("the model was unloaded", headers={"Retry-After": "5"}))
        for request_id in list(self._active):
            try:
                await self._engine.abort(request_id)
            except Exception:  # shutting down: an abort that fails must not stop the others
                log.debug("abort of %s failed during stop", request_id, exc_info=True)
        await self._engine.shutdown()

    def stats(self) -> SchedulerStats:
        self._stats.running = len(self._active)
        self._stats.waiting = self._queue.waiting
        return self._stats

    def delete_session(self, session_id: str) -> bool:
        return self._engine.delete_session(session_id)

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        return self._stats.requests.observe(request, self._generate(request))

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        self._check_open()
        self._queue.check_room()
        if request.request_id in self._active:
            raise ValueError(f"duplicate request id {request.request_id}")
        if not request.arrival_time:
            request.arrival_time = time.monotonic()
        await self._queue.acquire(request)
        self._stats.requests.scheduled(request.request_id)
        try:
            async with contextlib.aclosing(self._run(request)) as updates:
                async for out in updates:
                    yield out
        finally:
            self._queue.release()

    # -- admission ----------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if not self._started:
            raise ServiceUnavailableError("the model is not running; try again later", headers={"Retry-After": "5"})
        if not self._engine.healthy:
            raise ServiceUnavailableError(
                "the model's engine is unavailable; try again later", headers={"Retry-After": "5"}
            )

    # -- one request inside the engine --------------------------------------------------------------------------
    async def _run(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        self._check_open()  # the engine may have died while this request waited
        request_id = request.request_id
        self._active.add(request_id)
        stream = self._engine.generate(request)
        finished = False
        started = False
        try:
            try:
                async for out in stream:
                    started = True
                    finished = out.finished
                    yield out
                    if finished:
                        return
            except ValueError as exc:
                if not started:
                    raise InvalidRequestError(str(exc), param=getattr(exc, "param", None)) from None
                yield self._final(request, "error", str(exc))
            except EngineUnavailableError as exc:
                if not started:
                    raise ServiceUnavailableError(
                        str(exc) or "the model's engine is unavailable", headers={"Retry-After": "5"}
                    ) from None
                yield self._final(request, "abort", str(exc) or "the model's engine became unavailable; retry")
            except Exception:
                log.exception("engine failed on request %s", request_id)
                yield self._final(request, "error", "the model failed while generating; see the server log")
            else:
                yield self._final(request, "error", "the engine ended the stream before the request finished")
            finished = True
        finally:
            self._active.discard(request_id)
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:
                    log.debug("closing the engine stream of %s failed", request_id, exc_info=True)
            if not finished:  # the client went away: stop the engine's work on it
                try:
                    await self._engine.abort(request_id)
                except Exception:
                    log.debug("abort of %s failed", request_id, exc_info=True)

    @staticmethod
    def _final(request: GenerationRequest, reason: str, error: str) -> GenerationOutput:
        return GenerationOutput(
            request_id=request.request_id,
            new_token_ids=[],
            text="",
            finished=True,
            finish_reason=reason,
            prompt_tokens=len(request.prompt_token_ids),
            error=error,
        )
