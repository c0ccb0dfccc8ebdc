"""The dynamic batcher with a real python-backend model (tests/kserve_repository/batch_probe), in-process.

batch_probe answers Y = X * 10 and reports how many rows (ROWS) and requests (REQUESTS) the backend call saw,
after sleeping DELAY_MS, so each test can see exactly how requests were grouped.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from engines.backends.python_backend import PythonBackend
from engines.types import TensorModelSpec, TensorSpec
from gateway.errors import InternalError, InvalidRequestError, RateLimitError, ServiceUnavailableError
from gateway.scheduler.tensor.dynamic_batcher import BatchingPolicy, DynamicBatcher, QueueRules

REPO = Path(__file__).resolve().parents[3] / "kserve_repository"


def probe_backend(name: str = "batch_probe", max_batch_size: int = 32) -> PythonBackend:
    backend = PythonBackend()
    backend.load(
        TensorModelSpec(
            name=name,
            version=1,
            model_dir=str(REPO / name),
            version_dir=str(REPO / name / "1"),
            max_batch_size=max_batch_size,
            inputs=[TensorSpec("X", "INT64", [1]), TensorSpec("DELAY_MS", "INT32", [1], optional=True)],
            outputs=[
                TensorSpec("Y", "INT64", [1]),
                TensorSpec("ROWS", "INT32", [1]),
                TensorSpec("REQUESTS", "INT32", [1]),
            ],
        )
    )
    return backend


def request(x: int, delay_ms: int = 0, rows: int = 1) -> dict[str, np.ndarray]:
    inputs = {"X": np.full((rows, 1), x, dtype=np.int64)}
    if delay_ms:
        inputs["DELAY_MS"] = np.full((rows, 1), delay_ms, dtype=np.int32)
    return inputs


async def started(policy: BatchingPolicy, instances: int = 1) -> DynamicBatcher:
    batcher = DynamicBatcher("batch_probe", [probe_backend() for _ in range(instances)], policy)
    await batcher.start()
    return batcher


class FirstBatchHeld:
    """batch_probe, except that its first batch stays in the backend until the test opens `release`: the instance
    is busy for exactly as long as the test needs, however loaded the machine."""

    def __init__(self) -> None:
        self.backend = probe_backend()
        self.busy = threading.Event()  # the first batch is in the backend
        self.release = threading.Event()

    def execute(self, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        if not self.busy.is_set():
            self.busy.set()
            self.release.wait(timeout=30)
        return self.backend.execute(requests)

    def unload(self) -> None:
        self.backend.unload()


async def started_held(policy: BatchingPolicy) -> tuple[DynamicBatcher, FirstBatchHeld]:
    held = FirstBatchHeld()
    batcher = DynamicBatcher("batch_probe", [held], policy)  # type: ignore[list-item]
    await batcher.start()
    return batcher, held


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.005)


DYNAMIC = BatchingPolicy(max_batch_size=32, dynamic=True, max_queue_delay_s=0.2)


async def test_concurrent_requests_become_one_batch_and_rows_go_back() -> None:
    batcher = await started(DYNAMIC)
    try:
        results = await asyncio.gather(*(batcher.infer(request(i)) for i in range(10)))
        for i, out in enumerate(results):
            assert out["Y"].tolist() == [[i * 10]]
            assert out["REQUESTS"].tolist() == [[10]] and out["ROWS"].tolist() == [[10]]
        assert batcher.stats.execution_count == 1 and batcher.stats.inference_count == 10
        assert batcher.stats.success.count == 10 and batcher.stats.queue.count == 10
    finally:
        await batcher.stop()


async def test_multi_row_requests_and_max_batch_size() -> None:
    policy = BatchingPolicy(max_batch_size=8, dynamic=True, max_queue_delay_s=0.2)
    batcher = await started(policy)
    try:
        results = await asyncio.gather(*(batcher.infer(request(i, rows=3), rows=3) for i in range(5)))
        for i, out in enumerate(results):
            assert out["Y"].ravel().tolist() == [i * 10] * 3
            assert out["ROWS"].max() <= 8  # 3 + 3 fits, a third request does not
        assert batcher.stats.execution_count == 3 and batcher.stats.inference_count == 15
    finally:
        await batcher.stop()


async def test_full_batch_runs_without_waiting_for_the_delay() -> None:
    policy = BatchingPolicy(max_batch_size=4, dynamic=True, max_queue_delay_s=5.0)
    batcher = await started(policy)
    try:
        start = time.monotonic()
        results = await asyncio.gather(*(batcher.infer(request(i)) for i in range(4)))
        assert time.monotonic() - start < 2.0  # did not wait the 5 s delay
        assert all(r["REQUESTS"].item() == 4 for r in results)
    finally:
        await batcher.stop()


async def test_preferred_size_runs_early_and_rest_waits_for_the_delay() -> None:
    policy = BatchingPolicy(max_batch_size=32, dynamic=True, preferred_sizes=(4,), max_queue_delay_s=0.6)
    batcher = await started(policy)
    try:
        start = time.monotonic()
        tasks = [asyncio.create_task(batcher.infer(request(i))) for i in range(6)]
        await asyncio.gather(*tasks[:4])
        assert time.monotonic() - start < 0.45  # the preferred batch of 4 went at once
        assert not any(t.done() for t in tasks[4:])  # the other two wait for the delay
        results = await asyncio.gather(*tasks)
        assert [r["REQUESTS"].item() for r in results] == [4, 4, 4, 4, 2, 2]
    finally:
        await batcher.stop()


async def test_without_dynamic_batching_each_request_runs_alone() -> None:
    batcher = await started(BatchingPolicy(max_batch_size=32))
    try:
        results = await asyncio.gather(*(batcher.infer(request(i)) for i in range(5)))
        assert all(r["REQUESTS"].item() == 1 for r in results)
        assert batcher.stats.execution_count == 5
    finally:
        await batcher.stop()


async def test_instances_run_concurrently() -> None:
    batcher = await started(BatchingPolicy(max_batch_size=32), instances=2)
    try:
        start = time.monotonic()
        await asyncio.gather(batcher.infer(request(1, 400)), batcher.infer(request(2, 400)))
        assert time.monotonic() - start < 0.75  # two 400 ms calls side by side, not 800 ms
    finally:
        await batcher.stop()


async def test_higher_priority_goes_first() -> None:
    policy = BatchingPolicy(max_batch_size=32, priority_levels=2, default_priority=2)
    batcher, held = await started_held(policy)
    order: list[str] = []

    async def tracked(label: str, priority: int | None) -> None:
        await batcher.infer(request(0), priority=priority)
        order.append(label)

    try:
        blocker = asyncio.create_task(batcher.infer(request(0)))
        await until(held.busy.is_set)  # the instance is now busy
        tasks = [asyncio.create_task(tracked("low-1", None)), asyncio.create_task(tracked("low-2", 2))]
        await until(lambda: batcher.queued == 2)
        tasks.append(asyncio.create_task(tracked("high", 1)))
        await until(lambda: batcher.queued == 3)
        held.release.set()
        await asyncio.gather(blocker, *tasks)
        assert order == ["high", "low-1", "low-2"]
        with pytest.raises(InvalidRequestError, match="priority"):
            await batcher.infer(request(0), priority=3)
    finally:
        held.release.set()
        await batcher.stop()


async def test_full_queue_is_refused_at_once() -> None:
    policy = BatchingPolicy(max_batch_size=1, dynamic=True, queue_rules={0: QueueRules(max_queue_size=2)})
    batcher, held = await started_held(policy)
    try:
        running = asyncio.create_task(batcher.infer(request(0)))
        await until(held.busy.is_set)
        queued = [asyncio.create_task(batcher.infer(request(i))) for i in (1, 2)]
        await until(lambda: batcher.queued == 2)
        start = time.monotonic()
        with pytest.raises(RateLimitError, match="queue is full") as refused:
            await batcher.infer(request(3))
        assert time.monotonic() - start < 0.1 and refused.value.status == 429
        assert refused.value.headers["Retry-After"]
        held.release.set()
        assert [r["Y"].item() for r in await asyncio.gather(*queued)] == [10, 20]
        await running
    finally:
        held.release.set()
        await batcher.stop()


async def test_queue_timeout_reject_and_override() -> None:
    rules = QueueRules(timeout_action="REJECT", default_timeout_s=0.1, allow_timeout_override=True)
    batcher, held = await started_held(BatchingPolicy(max_batch_size=1, dynamic=True, queue_rules={0: rules}))
    try:
        running = asyncio.create_task(batcher.infer(request(0)))
        await until(held.busy.is_set)
        with pytest.raises(ServiceUnavailableError, match="timed out"):
            await batcher.infer(request(1))
        # the request's own, longer timeout: still queued 0.2 s on (twice the default), then served
        patient = asyncio.create_task(batcher.infer(request(2), timeout_us=10_000_000))
        await asyncio.sleep(0.2)
        assert batcher.queued == 1
        held.release.set()
        assert (await patient)["Y"].item() == 20
        await running
        assert batcher.stats.fail.count == 1
    finally:
        held.release.set()
        await batcher.stop()


async def test_queue_timeout_delay_moves_behind_others() -> None:
    rules = QueueRules(timeout_action="DELAY", default_timeout_s=0.1, allow_timeout_override=True)
    batcher, held = await started_held(BatchingPolicy(max_batch_size=1, dynamic=True, queue_rules={0: rules}))
    order: list[int] = []

    async def tracked(x: int, timeout_us: int | None = None) -> None:
        await batcher.infer(request(x), timeout_us=timeout_us)
        order.append(x)

    try:
        running = asyncio.create_task(batcher.infer(request(0)))
        await until(held.busy.is_set)
        first = asyncio.create_task(tracked(1))  # will time out while queued and be delayed
        await asyncio.sleep(0.25)
        second = asyncio.create_task(tracked(2, 10_000_000))  # arrives after 1 expired; does not expire itself
        await until(lambda: batcher.queued == 2)
        held.release.set()
        await asyncio.gather(running, first, second)
        assert order == [2, 1]
    finally:
        held.release.set()
        await batcher.stop()


async def test_preserve_ordering_across_instances() -> None:
    policy = BatchingPolicy(max_batch_size=1, dynamic=True, preserve_ordering=True)
    batcher = await started(policy, instances=2)
    finished: list[int] = []

    async def tracked(x: int, delay: int) -> None:
        await batcher.infer(request(x, delay))
        finished.append(x)

    try:
        await asyncio.gather(tracked(1, 400), tracked(2, 10))  # 2 finishes first but is released after 1
        assert finished == [1, 2]
    finally:
        await batcher.stop()


async def test_cancelled_request_leaves_the_queue() -> None:
    batcher, held = await started_held(BatchingPolicy(max_batch_size=1, dynamic=True))
    try:
        running = asyncio.create_task(batcher.infer(request(0)))
        await until(held.busy.is_set)
        doomed = asyncio.create_task(batcher.infer(request(1)))
        await asyncio.sleep(0.01)
        assert batcher.queued == 1
        doomed.cancel()
        await asyncio.gather(doomed, return_exceptions=True)
        assert batcher.queued == 0
        held.release.set()
        await running
        assert batcher.stats.inference_count == 1  # the cancelled request never ran
    finally:
        held.release.set()
        await batcher.stop()


class _Failing:
    """A backend that raises on every call with a message that must not reach clients."""

    def __init__(self) -> None:
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("secret internal detail")
        return [{"Y": r["X"]} for r in requests]

    def unload(self) -> None:
        pass


async def test_backend_failure_fails_only_that_batch() -> None:
    backend = _Failing()
    batcher = DynamicBatcher("failing", [backend], BatchingPolicy(max_batch_size=4))  # type: ignore[list-item]
    await batcher.start()
    try:
        with pytest.raises(InternalError) as failed:
            await batcher.infer(request(1))
        assert "secret" not in failed.value.message and failed.value.status == 500
        assert (await batcher.infer(request(2)))["Y"].item() == 2
    finally:
        await batcher.stop()


async def test_stop_fails_queued_requests_cleanly() -> None:
    batcher, held = await started_held(BatchingPolicy(max_batch_size=1, dynamic=True))
    running = asyncio.create_task(batcher.infer(request(0)))
    await until(held.busy.is_set)
    queued = asyncio.create_task(batcher.infer(request(1)))
    await asyncio.sleep(0.01)
    stopping = asyncio.create_task(batcher.stop())
    await until(queued.done)  # failed at once, while the batch in the backend still runs
    assert not running.done()
    held.release.set()
    await stopping
    assert (await running)["Y"].item() == 0  # in flight: finished
    with pytest.raises(ServiceUnavailableError):
        await queued
    with pytest.raises(ServiceUnavailableError):
        await batcher.infer(request(2))
