"""Admission control in front of engines that batch internally (vLLM, TensorRT-LLM, remote upstreams).

Those engines schedule their own steps, so the gateway does not build batches for them. It decides *which* requests
enter the engine and *when* (admission_queue.py, shared with the passthrough scheduler): at most
`scheduler.max_num_seqs` at once (beyond that the engine would only queue them itself, where our priorities cannot
reach), waiting requests ordered by (priority, arrival) with aging, under the queue policy of queue_policy.py (a
bounded queue, per-request timeouts, 429 with Retry-After). A stream aborts its engine request when the client goes
away (the iterator is closed). Engine failures become the gateway's errors: a bad request 400, an unavailable
engine 503 (and the model reports not ready), a failure mid-stream a final update with finish_reason "error" or
"abort".

Session affinity is the engine's business (a remote engine pins a session to one upstream); this scheduler passes
`session_id` through and forwards `delete_session`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator

from engines.interface import AsyncGenerateEngine, EngineUnavailableError, Tokenizer
from engines.types import EngineInfo, GenerationOutput, GenerationRequest
from gateway.errors import InvalidRequestError, ServiceUnavailableError
from gateway.repository.model_config import SchedulerConfig
from gateway.scheduler.llm.admission_queue import AdmissionQueue
from gateway.scheduler.llm.interface import LLMScheduler, SchedulerStats

log = logging.getLogger("switchyard.scheduler.admission")


class AdmissionScheduler(LLMScheduler):
    def __init__(self, engine: AsyncGenerateEngine, scheduler: SchedulerConfig | None = None) -> None:
        """`scheduler`: the model config's section (`max_num_seqs` requests inside the engine at once)."""
        self._engine = engine
        self._queue = AdmissionQueue(scheduler or SchedulerConfig())
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
        self._queue.close()
        for request_id in list(self._active):
            try:
                await self._engine.abort(request_id)
            except Exception:  # shutting down: an abort that fails must not stop the others
                log.debug("abort of %s failed during stop", request_id, exc_info=True)
        await self._engine.shutdown()

    def stats(self) -> SchedulerStats:
        self._stats.running = len(self._active)
        self._queue.record(self._stats)
        return self._stats

    def delete_session(self, session_id: str) -> bool:
        return self._engine.delete_session(session_id)

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        return self._stats.requests.observe(request, self._generate(request))

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        self._check_open()
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
