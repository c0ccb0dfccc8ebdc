"""Triton's dynamic batcher for v2 tensor models: many requests, one backend call.

Requests wait in per-priority FIFO queues (level 1 is served first). Whenever a model instance is free, the
batcher forms a batch from the head of the queues: requests whose inputs have the same shapes past the batch
dimension, up to `max_batch_size` rows. It runs the batch at once when it reaches the largest preferred size (or
`max_batch_size`), otherwise it waits for more requests until the oldest has waited `max_queue_delay`, then runs
the largest preferred size it can form (or everything that fits). Without dynamic batching every request runs
alone, still through the queue, so queue policies and instance concurrency apply to all models.

Queue policies: a full queue rejects at once (429 / gRPC UNAVAILABLE); a request that outlives its timeout while
queued is rejected (REJECT, 503) or moved behind every other request (DELAY). With the rate limiter on
(`gates`), a formed batch waits until its instance holds its resources (see rate_limiter.py). Each instance executes
on its own worker thread (never on the event loop); `instance_count` instances run batches concurrently. Outputs are
split back per request; `preserve_ordering` releases responses in arrival order. Decoupled models stream responses.
All queue state is touched only on the event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engines.interface import TensorBackend
from gateway.errors import InternalError, InvalidRequestError, RateLimitError, ServiceUnavailableError, SwitchyardError
from gateway.observability.inference_stats import ModelStats
from gateway.scheduler.tensor.rate_limiter import InstanceGate

log = logging.getLogger("switchyard.batcher")

_DONE = object()
# Responses of a decoupled model that may wait unread; past this the model's generator waits for the client.
MAX_PENDING_RESPONSES = 64


@dataclass(frozen=True)
class QueueRules:
    """A queue policy in seconds (Triton's ModelQueuePolicy)."""

    timeout_action: str = "REJECT"
    default_timeout_s: float = 0.0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclass(frozen=True)
class BatchingPolicy:
    """How one model version is batched; built from its config by the model layer."""

    max_batch_size: int = 0  # 0: no batch dimension, one request per call
    dynamic: bool = False  # combine requests (dynamic_batching present and max_batch_size > 0)
    preferred_sizes: tuple[int, ...] = ()
    max_queue_delay_s: float = 0.0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority: int = 0
    queue_rules: dict[int, QueueRules] = field(default_factory=dict)  # level -> rules; 0 = default
    decoupled: bool = False

    def rules(self, level: int) -> QueueRules:
        return self.queue_rules.get(level) or self.queue_rules.get(0) or QueueRules()


@dataclass(eq=False)
class _Item:
    inputs: dict[str, np.ndarray]
    rows: int
    signature: tuple[Any, ...]
    level: int
    seq: int
    arrival_ns: int
    future: asyncio.Future[Any] | None = None
    stream: asyncio.Queue[Any] | None = None
    room: threading.Semaphore | None = None  # free slots in `stream` (decoupled backpressure)
    timer: asyncio.TimerHandle | None = None
    queued: bool = True
    delayed: bool = False
    cancelled: bool = False


def _wait_for_room(item: _Item) -> bool:
    """On the worker thread: wait while the client has MAX_PENDING_RESPONSES unread (bounded buffering for slow
    readers); False once the client is gone."""
    while not item.cancelled:
        if item.room is None or item.room.acquire(timeout=0.2):
            return True
    return False


def _signature(inputs: dict[str, np.ndarray], batched: bool) -> tuple[Any, ...]:
    skip = 1 if batched else 0
    return tuple(sorted((name, a.dtype.str, a.shape[skip:]) for name, a in inputs.items()))


class DynamicBatcher:
    def __init__(
        self,
        name: str,
        instances: Sequence[TensorBackend],
        policy: BatchingPolicy,
        stats: ModelStats | None = None,
        gates: Sequence[InstanceGate] | None = None,
    ) -> None:
        if not instances:
            raise ValueError("a batcher needs at least one model instance")
        self.name = name
        self._gates = list(gates) if gates else None  # rate limiter access, one per instance (--rate-limit)
        self.policy = policy
        self.stats = stats or ModelStats()
        self._instances = list(instances)
        self._queues: dict[int, deque[_Item]] = {}
        self._delayed: deque[_Item] = deque()
        self._arrived = asyncio.Event()
        self._free: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(self._instances)):
            self._free.put_nowait(i)
        self._seq = itertools.count()
        self._next_release = 0
        self._ready: dict[int, Callable[[], None]] = {}
        self._running: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=len(self._instances), thread_name_prefix=f"v2-{name}")
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._schedule(), name=f"batcher-{self.name}")

    async def stop(self) -> None:
        """Refuse new work, fail what is queued, let running batches finish, then free the threads."""
        self._closed = True
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        for item in [*itertools.chain(*self._queues.values()), *self._delayed]:
            self._fail(item, ServiceUnavailableError(f"model '{self.name}' is unloading"), "OTHER")
        self._queues.clear()
        self._delayed.clear()
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        self._executor.shutdown(wait=False)

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values()) + len(self._delayed)

    # ------------------------------------------------------------------ requests

    def _level(self, priority: int | None) -> int:
        levels = self.policy.priority_levels
        if not levels:
            return 0
        if priority is None or priority == 0:
            return self.policy.default_priority or 1
        if not 1 <= priority <= levels:
            raise InvalidRequestError(f"priority must be between 1 and {levels} for model '{self.name}'")
        return priority

    def _enqueue(self, inputs: dict[str, np.ndarray], rows: int, priority: int | None, timeout_us: int | None) -> _Item:
        if self._closed:
            raise ServiceUnavailableError(f"model '{self.name}' is not serving")
        level = self._level(priority)
        rules = self.policy.rules(level)
        queue = self._queues.setdefault(level, deque())
        if rules.max_queue_size and len(queue) >= rules.max_queue_size:
            self.stats.record_failure(0, "REJECTED")
            raise RateLimitError(
                f"model '{self.name}': the request queue is full ({rules.max_queue_size}); retry later",
                headers={"Retry-After": "1"},
            )
        timeout_s = rules.default_timeout_s
        if timeout_us is not None:
            if timeout_us < 0:
                raise InvalidRequestError("timeout must be a non-negative number of microseconds")
            if rules.allow_timeout_override:
                timeout_s = timeout_us / 1e6
        item = _Item(
            inputs,
            rows,
            _signature(inputs, self.policy.max_batch_size > 0),
            level,
            next(self._seq),
            time.monotonic_ns(),
        )
        if timeout_s > 0:
            item.timer = asyncio.get_running_loop().call_later(timeout_s, self._expire, item, rules)
        queue.append(item)
        self._arrived.set()
        return item

    async def infer(
        self, inputs: dict[str, np.ndarray], rows: int = 1, priority: int | None = None, timeout_us: int | None = None
    ) -> dict[str, Any]:
        """Queue one request (`rows` = its batch size) and wait for its outputs."""
        if self.policy.decoupled:
            raise InvalidRequestError(
                f"model '{self.name}' is decoupled; use streaming (ModelStreamInfer or generate_stream)"
            )
        item = self._enqueue(inputs, rows, priority, timeout_us)
        item.future = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.shield(item.future)
        except asyncio.CancelledError:
            self._cancel(item)
            raise

    async def infer_stream(
        self, inputs: dict[str, np.ndarray], rows: int = 1, priority: int | None = None, timeout_us: int | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Queue one request and yield its responses (one for ordinary models, zero or more when decoupled)."""
        if not self.policy.decoupled:
            yield await self.infer(inputs, rows, priority, timeout_us)
            return
        item = self._enqueue(inputs, rows, priority, timeout_us)
        item.stream = asyncio.Queue()
        item.room = threading.Semaphore(MAX_PENDING_RESPONSES)
        try:
            while True:
                got = await item.stream.get()
                if got is _DONE:
                    return
                if isinstance(got, BaseException):
                    raise got
                item.room.release()
                yield got
        finally:
            self._cancel(item)

    def _cancel(self, item: _Item) -> None:
        """The client went away: drop the request if it is still queued, or stop streaming it."""
        item.cancelled = True
        if item.queued:
            self._remove(item)
            self.stats.record_failure(time.monotonic_ns() - item.arrival_ns, "CANCELED")
            self._settle(item, lambda: None)
            self._arrived.set()  # the batch being gathered may have lost its head

    def _remove(self, item: _Item) -> None:
        item.queued = False
        if item.timer is not None:
            item.timer.cancel()
        for queue in (self._queues.get(item.level), self._delayed):
            if queue is not None and item in queue:
                queue.remove(item)
                return

    def _expire(self, item: _Item, rules: QueueRules) -> None:
        if not item.queued:
            return
        if rules.timeout_action == "DELAY":
            self._queues[item.level].remove(item)
            item.delayed = True
            self._delayed.append(item)
            self._arrived.set()
            return
        self._remove(item)
        self._fail(item, ServiceUnavailableError(f"model '{self.name}': request timed out in the queue"), "REJECTED")
        self._arrived.set()

    # ------------------------------------------------------------------ responses

    def _settle(self, item: _Item, action: Callable[[], None]) -> None:
        """Run `action` (deliver a result) now, or in arrival order when preserve_ordering is set."""
        if not self.policy.preserve_ordering or item.stream is not None:
            action()
            return
        self._ready[item.seq] = action
        while self._next_release in self._ready:
            self._ready.pop(self._next_release)()
            self._next_release += 1

    def _fail(self, item: _Item, error: BaseException, reason: str = "BACKEND") -> None:
        self.stats.record_failure(time.monotonic_ns() - item.arrival_ns, reason)

        def deliver() -> None:
            if item.future is not None and not item.future.done():
                item.future.set_exception(error)
            if item.stream is not None:
                item.stream.put_nowait(error)

        self._settle(item, deliver)

    def _succeed(self, item: _Item, outputs: dict[str, Any]) -> None:
        self.stats.success.add(time.monotonic_ns() - item.arrival_ns)

        def deliver() -> None:
            if item.future is not None and not item.future.done():
                item.future.set_result(outputs)

        self._settle(item, deliver)

    # ------------------------------------------------------------------ scheduling

    def _ordered(self) -> list[_Item]:
        return [*itertools.chain(*(self._queues[k] for k in sorted(self._queues))), *self._delayed]

    def _candidates(self) -> list[_Item]:
        """The head request plus compatible followers, in service order, while they fit max_batch_size."""
        ordered = self._ordered()
        if not ordered:
            return []
        head = ordered[0]
        if not self.policy.dynamic:
            return [head]
        picked, rows = [head], head.rows
        for item in ordered[1:]:
            if rows >= self.policy.max_batch_size:
                break
            if item.signature == head.signature and rows + item.rows <= self.policy.max_batch_size:
                picked.append(item)
                rows += item.rows
        return picked

    def _choose(self, candidates: list[_Item], expired: bool) -> list[_Item] | None:
        """The batch to run now, or None to keep waiting for more requests."""
        if not self.policy.dynamic:
            return candidates
        sums = list(itertools.accumulate(c.rows for c in candidates))
        preferred = self.policy.preferred_sizes
        target = max(preferred) if preferred else self.policy.max_batch_size
        if sums[-1] < target and not expired:
            return None
        if preferred:
            hits = [i for i, s in enumerate(sums) if s in preferred]
            if hits:
                return candidates[: hits[-1] + 1]
        return candidates

    async def _gather(self) -> list[_Item]:
        while True:
            candidates = self._candidates()
            if not candidates:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            wait_s = candidates[0].arrival_ns / 1e9 + self.policy.max_queue_delay_s - time.monotonic()
            batch = self._choose(candidates, expired=wait_s <= 0)
            if batch is not None:
                return batch
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout=wait_s)
            except TimeoutError:
                pass

    async def _schedule(self) -> None:
        while True:
            instance = await self._free.get()
            batch = await self._gather()
            for item in batch:
                self._remove(item)
            task = asyncio.create_task(self._run(instance, batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, instance: int, batch: list[_Item]) -> None:
        gate = self._gates[instance] if self._gates else None
        if gate is not None:  # the rate limiter: run only while this instance holds its resources
            try:
                waited = await gate.acquire()
            except BaseException:
                for item in batch:
                    self._fail(item, ServiceUnavailableError(f"model '{self.name}' is unloading"), "OTHER")
                self._free.put_nowait(instance)
                raise
            self.stats.rate_limiter.add(waited * len(batch), len(batch))
        start = time.monotonic_ns()
        for item in batch:
            self.stats.queue.add(start - item.arrival_ns)
        try:
            if self.policy.decoupled:
                await self._run_decoupled(instance, batch)
                return
            loop = asyncio.get_running_loop()
            backend = self._instances[instance]
            try:
                results = await loop.run_in_executor(self._executor, backend.execute, [i.inputs for i in batch])
                if not isinstance(results, list) or len(results) != len(batch):
                    raise RuntimeError(f"backend returned {type(results).__name__} for {len(batch)} requests")
            except Exception:
                log.exception("model '%s' failed on a batch of %d request(s)", self.name, len(batch))
                for item in batch:
                    self._fail(item, InternalError(f"model '{self.name}' failed to execute; see the server log"))
                return
            infer_ns = time.monotonic_ns() - start
            self.stats.record_batch(sum(i.rows for i in batch), len(batch), 0, infer_ns, 0)
            for item, result in zip(batch, results, strict=True):
                if isinstance(result, SwitchyardError):
                    self._fail(item, result)
                elif isinstance(result, Exception):
                    self._fail(item, InvalidRequestError(str(result)[:500] or type(result).__name__))
                elif not isinstance(result, dict):
                    log.error("model '%s' returned a %s instead of a dict", self.name, type(result).__name__)
                    self._fail(item, InternalError(f"model '{self.name}' returned an invalid response"))
                else:
                    self._succeed(item, result)
        finally:
            if gate is not None:
                gate.release(again=self.queued > 0)
            self._free.put_nowait(instance)

    async def _run_decoupled(self, instance: int, batch: list[_Item]) -> None:
        """Iterate each request's responses on the worker thread, handing them to the event loop as they come."""
        loop = asyncio.get_running_loop()
        backend = self._instances[instance]

        def work() -> None:
            results = backend.execute([i.inputs for i in batch])
            if not isinstance(results, list) or len(results) != len(batch):
                raise RuntimeError(f"backend returned {type(results).__name__} for {len(batch)} requests")
            for item, responses in zip(batch, results, strict=True):
                assert item.stream is not None
                try:
                    if isinstance(responses, Exception):  # the model refused this request
                        refused = (
                            responses
                            if isinstance(responses, SwitchyardError)
                            else InvalidRequestError(str(responses)[:500] or type(responses).__name__)
                        )
                        loop.call_soon_threadsafe(item.stream.put_nowait, refused)
                    else:
                        for response in responses:
                            if not _wait_for_room(item):
                                break
                            loop.call_soon_threadsafe(item.stream.put_nowait, response)
                except Exception:  # one request's generator failed: that request alone fails
                    log.exception("model '%s' failed while streaming a response", self.name)
                    failed = InternalError(f"model '{self.name}' failed to execute; see the server log")
                    loop.call_soon_threadsafe(item.stream.put_nowait, failed)
                finally:
                    close = getattr(responses, "close", None)
                    if callable(close):
                        close()
                loop.call_soon_threadsafe(item.stream.put_nowait, _DONE)

        start = time.monotonic_ns()
        try:
            await loop.run_in_executor(self._executor, work)
        except Exception:
            log.exception("model '%s' failed on a batch of %d request(s)", self.name, len(batch))
            for item in batch:
                self._fail(item, InternalError(f"model '{self.name}' failed to execute; see the server log"))
            return
        self.stats.record_batch(sum(i.rows for i in batch), len(batch), 0, time.monotonic_ns() - start, 0)
        for item in batch:
            self.stats.success.add(time.monotonic_ns() - item.arrival_ns)
