"""The rate limiter: amounts (default and given), global vs per-device pools, head-of-line order and priority
weighting under contention, and cancellation."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import ConfigError
from gateway.scheduler.tensor.rate_limiter import RateLimiter, ResourceLimit


def test_default_amount_is_the_largest_need_and_flags_override() -> None:
    limiter = RateLimiter()
    limiter.gate("a/1/0", [("R1", 4, False), ("R2", 4, False)], 1)
    limiter.gate("b/1/0", [("R2", 5, False), ("R3", 10, True)], 1)
    assert {(n, d): a for n, d, a, _ in limiter.snapshot()} == {("R1", 0): 4, ("R2", 0): 5, ("R3", None): 10}
    given = RateLimiter([ResourceLimit.parse("R1:10"), ResourceLimit.parse("R1:2:0")])
    assert given.amount(("R1", 0)) == 2 and given.amount(("R1", 1)) == 10
    with pytest.raises(ConfigError, match="gives 2 on device 0"):
        given.gate("c/1/0", [("R1", 3, False)], 1)
    with pytest.raises(ConfigError, match="global"):
        limiter.gate("d/1/0", [("R3", 1, False)], 1)
    with pytest.raises(ConfigError, match="NAME:COUNT"):
        ResourceLimit.parse("R1:x")


async def test_an_instance_runs_only_when_its_resources_are_free() -> None:
    limiter = RateLimiter([ResourceLimit.parse("R:1")])
    a = limiter.gate("a", [("R", 1, True)], 1)
    b = limiter.gate("b", [("R", 1, True)], 1)
    free = limiter.gate("free", [], 1)
    await a.acquire()
    waiting = asyncio.create_task(b.acquire())
    await asyncio.sleep(0.01)
    assert not waiting.done() and limiter.waiting == 1
    await asyncio.wait_for(free.acquire(), 1)  # needs nothing: never waits
    a.release()
    assert await asyncio.wait_for(waiting, 1) > 0
    b.release()


async def test_priorities_share_turns_under_contention() -> None:
    limiter = RateLimiter()
    fast = limiter.gate("fast", [("R", 1, False)], 1)
    slow = limiter.gate("slow", [("R", 1, False)], 2)
    order: list[str] = []

    async def worker(gate, name: str, turns: int) -> None:
        for i in range(turns):
            await gate.acquire()
            order.append(name)
            await asyncio.sleep(0.001)
            gate.release(again=i < turns - 1)

    await asyncio.gather(worker(fast, "fast", 40), worker(slow, "slow", 40))
    first = order[:30]  # both always waiting here
    assert 18 <= first.count("fast") <= 22, order
    assert len(order) == 80


async def test_head_of_line_keeps_order_and_cancel_frees_the_line() -> None:
    limiter = RateLimiter()
    big = limiter.gate("big", [("R", 2, True)], 1)
    small = [limiter.gate(f"s{i}", [("R", 1, True)], 1) for i in range(2)]
    await small[0].acquire()
    big_task = asyncio.create_task(big.acquire())
    await asyncio.sleep(0.01)
    late = asyncio.create_task(small[1].acquire())  # would fit, but the big one is ahead
    await asyncio.sleep(0.01)
    assert not late.done()
    big_task.cancel()
    await asyncio.gather(big_task, return_exceptions=True)
    await asyncio.wait_for(late, 1)  # the line moved on
    small[0].release()
    small[1].release()
    await asyncio.wait_for(big.acquire(), 1)
