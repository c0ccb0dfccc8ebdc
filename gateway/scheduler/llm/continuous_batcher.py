"""The async driver of continuous batching: runs `StepScheduler`'s steps on a step engine and streams the outputs.

It owns what the policy must not: the worker thread the model step runs in, the event-loop task that loops over
steps, the wake-ups when requests arrive or leave, and each request's stream. All scheduling state is touched only
on the event loop; the model step runs in one worker thread, while the loop keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from engines.interface import StepEngine, Tokenizer
from engines.types import EngineInfo, GenerationOutput, GenerationRequest, StepResult
from gateway.errors import OverloadedError, ServiceUnavailableError
from gateway.repository.engine_config import SpeculativeSection
from gateway.repository.model_config import KVCacheConfig, SchedulerConfig
from gateway.scheduler.llm.interface import LLMScheduler, SchedulerStats
from gateway.scheduler.llm.queue_policy import QUEUE_TIMEOUT, REJECTED
from gateway.scheduler.llm.step_scheduler import StepPlan, StepScheduler

log = logging.getLogger("switchyard.scheduler")


class ContinuousBatcher(LLMScheduler):
    """The LLM scheduler of step engines (the native engine): `StepScheduler`'s policy, driven on the event loop."""

    def __init__(
        self,
        engine: StepEngine,
        scheduler: SchedulerConfig | None = None,
        kv_cache: KVCacheConfig | None = None,
        speculative: SpeculativeSection | None = None,
    ) -> None:
        """The sections are the model config's, as `StepScheduler` takes them."""
        self._engine = engine
        self._policy = StepScheduler(engine.info, engine.tokenizer, scheduler, kv_cache, speculative)
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="switchyard-step")
        self._task: asyncio.Task[None] | None = None
        self._streams: dict[str, asyncio.Queue[GenerationOutput]] = {}  # unfinished requests' streams
        # outputs of the last step (and finishes), handed to their streams by _flush
        self._outbox: list[tuple[asyncio.Queue[GenerationOutput], GenerationOutput]] = []

    # -- LLMScheduler -------------------------------------------------------------------------------------------
    @property
    def info(self) -> EngineInfo:
        return self._engine.info

    @property
    def tokenizer(self) -> Tokenizer:
        return self._engine.tokenizer

    @property
    def engine(self) -> StepEngine:
        return self._engine

    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name="switchyard-continuous-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._deliver(self._policy.finish_all("abort", error="the model was unloaded"))
        self._flush()
        self._executor.shutdown(wait=True)
        self._engine.shutdown()

    @property
    def healthy(self) -> bool:
        return self._task is not None and not self._task.done()

    def stats(self) -> SchedulerStats:
        return self._policy.stats()

    def delete_session(self, session_id: str) -> bool:
        return self._policy.delete_session(session_id)

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        return self._policy.stats().requests.observe(request, self._generate(request))

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        queue = self._add(request)
        try:
            while True:
                out = await queue.get()
                if out.finish_reason == REJECTED:  # timed out before it started: refused as a full queue is
                    raise OverloadedError(
                        out.error or "the model is overloaded; retry later",
                        reason=QUEUE_TIMEOUT,
                        retry_after=self._policy.retry_after(),
                    )
                yield out
                if out.finished:
                    return
        finally:
            if self._streams.get(request.request_id) is queue:  # closed early: the sequence is still scheduled
                self._policy.abort(request.request_id)
                self._wakeup.set()

    def _add(self, request: GenerationRequest) -> asyncio.Queue[GenerationOutput]:
        if self._task is None or self._task.done():
            raise ServiceUnavailableError("the model is not running; try again later", headers={"Retry-After": "5"})
        self._policy.add(request)
        queue: asyncio.Queue[GenerationOutput] = asyncio.Queue()
        self._streams[request.request_id] = queue
        self._wakeup.set()
        return queue

    # -- the step loop ------------------------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            try:
                await self._iteration()
            except asyncio.CancelledError:
                raise
            except Exception:
                # A scheduling bug must not strand requests: fail everything in flight and keep serving.
                stats = self._policy.stats()
                log.exception(
                    "scheduler iteration failed; failing %d in-flight sequences", stats.running + stats.waiting
                )
                self._deliver(self._policy.finish_all("error", error="internal scheduler error; see the server log"))
                self._flush()

    async def _iteration(self) -> None:
        plan = self._policy.schedule()
        self._deliver(plan.finished)
        if not plan.scheduled:
            self._flush()
            # Nothing fits right now (blocks are held by sequences being aborted), or lower priorities are held back
            # for an expected arrival: wait that long; idle: a second (idle sessions expire once a second). A request
            # that arrives or leaves wakes it at once.
            timeout = (plan.idle_seconds or 0.01) if self._policy.has_unfinished() else 1.0
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=timeout)
            except TimeoutError:
                pass
            return
        try:
            result = await self._execute(plan)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("model step failed; failing the %d sequences in it", len(plan.scheduled))
            self._deliver(self._policy.fail(plan, "the model failed while generating; see the server log"))
            return
        self._deliver(self._policy.update(plan, result))

    async def _execute(self, plan: StepPlan) -> StepResult:
        steps = plan.steps
        loop = asyncio.get_running_loop()
        started = asyncio.Event()

        def step() -> StepResult:
            loop.call_soon_threadsafe(started.set)
            return self._engine.execute(steps)

        future = loop.run_in_executor(self._executor, step)
        if self._outbox:
            # The last step's outputs wake their streams only once this step's thread holds the GIL: woken
            # first, their Python (detokenized text, SSE) kept the step waiting for it 2-3 ms per step.
            await started.wait()
            self._flush()
        return await future

    # -- outputs to streams -------------------------------------------------------------------------------------
    def _deliver(self, outputs: list[GenerationOutput]) -> None:
        """Queue outputs for their streams; a finished request's stream is detached and its engine state dropped."""
        for out in outputs:
            queue = self._streams[out.request_id]
            self._outbox.append((queue, out))
            if out.finished:
                del self._streams[out.request_id]
                self._engine.release(out.request_id)

    def _flush(self) -> None:
        """Hand the outputs gathered since the last flush to their streams, in order."""
        for queue, out in self._outbox:
            queue.put_nowait(out)
        self._outbox.clear()
