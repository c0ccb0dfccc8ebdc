"""The admission queue on its own: slots, (priority, arrival) order with aging, the bound, expected-wait shedding,
timeouts (REJECT and DELAY), a closed model, and slots handed on when a caller goes away. The schedulers that use
it: test_admission.py, test_passthrough_scheduler.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from engines.types import GenerationRequest, SamplingParams
from gateway.errors import OverloadedError, ServiceUnavailableError
from gateway.repository.model_config import SchedulerConfig
from gateway.scheduler.llm import admission_queue
from gateway.scheduler.llm.admission_queue import AdmissionQueue
from gateway.scheduler.llm.interface import SchedulerStats


class Clock:
    """The queue's clock (`time.monotonic` in admission_queue.py), moved by hand; asyncio keeps the real one."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(admission_queue, "time", fake)
    return fake


def req(rid: str, priority: int = 0, timeout: float | None = None, arrival: float | None = None) -> GenerationRequest:
    return GenerationRequest(
        rid,
        [],
        SamplingParams(max_tokens=1),
        priority,
        queue_timeout=timeout,
        arrival_time=time.monotonic() if arrival is None else arrival,
    )


async def settle() -> None:
    """Let every task run until it waits again (a grant reaches its caller through a shield and `wait_for`)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def queued(queue: AdmissionQueue, *requests: GenerationRequest) -> dict[str, asyncio.Task[None]]:
    """Each request's `acquire` as a task, run until it waits (or holds a slot)."""
    tasks = {r.request_id: asyncio.create_task(queue.acquire(r)) for r in requests}
    await settle()
    return tasks


async def admitted_in_turn(queue: AdmissionQueue, tasks: dict[str, asyncio.Task[None]]) -> list[str]:
    """Release one slot at a time and name the request each release admitted."""
    order: list[str] = []
    while len(order) < len(tasks):
        queue.release()
        await settle()
        admitted = [rid for rid, task in tasks.items() if task.done() and rid not in order]
        assert len(admitted) == 1, admitted
        order += admitted
    return order


async def cancelled(tasks: dict[str, asyncio.Task[None]]) -> None:
    for task in tasks.values():
        task.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)


async def test_requests_beyond_the_slots_wait_and_a_release_admits_the_next() -> None:
    queue = AdmissionQueue(SchedulerConfig(max_num_seqs=2))
    tasks = await queued(queue, req("a"), req("b"), req("c"))
    assert [tasks[r].done() for r in "abc"] == [True, True, False] and queue.waiting == 1
    queue.release()
    await settle()
    assert tasks["c"].done() and queue.waiting == 0


async def test_waiting_requests_enter_by_priority_then_arrival_and_the_starved_first(clock: Clock) -> None:
    queue = AdmissionQueue(SchedulerConfig(max_num_seqs=1, aging_seconds=30))
    await queue.acquire(req("holder", arrival=clock.now))
    tasks = await queued(
        queue,
        req("old-low", 9, arrival=clock.now - 31),
        req("low", 5, arrival=clock.now),
        req("high", -1, arrival=clock.now),
        req("mid", 0, arrival=clock.now),
        req("mid2", 0, arrival=clock.now),
    )
    assert await admitted_in_turn(queue, tasks) == ["old-low", "high", "mid", "mid2", "low"]


async def test_a_full_queue_refuses_with_429_and_retry_after_but_a_free_slot_never_does() -> None:
    queue = AdmissionQueue(SchedulerConfig(max_num_seqs=1, max_queue_size=1))
    tasks = await queued(queue, req("holder"), req("waiter"))
    with pytest.raises(OverloadedError, match="queue is full") as err:
        await queue.acquire(req("third"))
    assert err.value.status == 429 and err.value.reason == "queue_full" and err.value.headers["Retry-After"] == "1"
    stats = SchedulerStats()
    queue.record(stats)
    assert (stats.waiting, stats.rejected) == (1, {"queue_full": 1})
    await admitted_in_turn(queue, {"waiter": tasks["waiter"]})
    queue.release()  # both slots' holders gone: a request that finds a free slot is admitted at once
    await asyncio.wait_for(queue.acquire(req("later")), 1)


async def test_an_arrival_that_cannot_start_within_its_timeout_is_shed_at_once(clock: Clock) -> None:
    queue = AdmissionQueue(SchedulerConfig(max_num_seqs=1, default_timeout_seconds=30))
    tasks = await queued(queue, *(req(f"r{i}") for i in range(7)))  # r0 holds the slot, six wait
    for _ in range(3):  # the model admits one a second while requests wait: the rate becomes known
        clock.now += 1.0
        queue.release()
    await settle()
    stats = SchedulerStats()
    queue.record(stats)
    assert stats.waiting == 3 and 2.5 < stats.expected_wait_seconds < 3.5  # three ahead at about one a second
    with pytest.raises(OverloadedError, match="3 requests are ahead") as err:
        await queue.acquire(req("impatient", timeout=2.0))
    assert err.value.reason == "expected_wait" and err.value.headers["Retry-After"] == "1"  # 2.9 s: 0.9 s past it
    urgent = await queued(queue, req("urgent", priority=-1, timeout=2.0))  # none ahead of it: it may wait
    assert queue.waiting == 4 and not urgent["urgent"].done()
    await cancelled(tasks | urgent)


async def test_a_request_still_waiting_at_its_timeout_is_refused_and_leaves_the_queue() -> None:
    queue = AdmissionQueue(SchedulerConfig(max_num_seqs=1))
    await queue.acquire(req("holder"))
    with pytest.raises(OverloadedError, match=r"waited 0\.05 s") as err:
        await queue.acquire(req("late", timeout=0.05))
    assert err.value.reason == "queue_timeout" and err.value.headers["Retry-After"].isdigit()
    assert queue.waiting == 0
    queue.release()
    await asyncio.wait_for(queue.acquire(req("next")), 1)  # the slot was not lost


async def test_delay_puts_a_late_request_behind_every_other_one() -> None:
    queue = AdmissionQueue(SchedulerConfig(max_num_seqs=1, timeout_action="DELAY"))
    await queue.acquire(req("holder"))
    late = await queued(queue, req("late", priority=-5, timeout=0.02))
    await asyncio.sleep(0.1)  # past its timeout: still waiting, now behind everyone
    on_time = await queued(queue, req("on-time", priority=5))
    assert await admitted_in_turn(queue, late | on_time) == ["on-time", "late"]
    stats = SchedulerStats()
    queue.record(stats)
    assert stats.rejected == {}


async def test_closing_refuses_every_waiting_request_with_503() -> None:
    queue = AdmissionQueue(SchedulerConfig(max_num_seqs=1))
    tasks = await queued(queue, req("holder"), req("a"), req("b"))
    queue.close()
    for rid in "ab":
        with pytest.raises(ServiceUnavailableError, match="unloaded"):
            await tasks[rid]
    assert queue.waiting == 0


async def test_a_slot_granted_to_a_caller_that_went_away_is_handed_on() -> None:
    # without a timeout: Python 3.11's wait_for lets a grant win over a cancellation that comes in the same tick,
    # and the caller then holds the slot (and releases it as it ends)
    queue = AdmissionQueue(SchedulerConfig(max_num_seqs=1, default_timeout_seconds=0))
    tasks = await queued(queue, req("holder"), req("gone"), req("next"))
    queue.release()  # grants "gone" its slot ...
    tasks["gone"].cancel()  # ... in the same tick its client disconnects
    await asyncio.gather(tasks["gone"], return_exceptions=True)
    await asyncio.wait_for(tasks["next"], 1)
    tasks = await queued(queue, req("after"))
    assert not tasks["after"].done()  # "next" holds the only slot: none was lost or doubled
    await cancelled(tasks)
