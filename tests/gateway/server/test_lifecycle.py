"""Lifecycle: drain waits for in-flight requests, within the grace period."""

from __future__ import annotations

import asyncio

from gateway.server.lifecycle import Lifecycle


async def test_drain_waits_for_in_flight_requests() -> None:
    life = Lifecycle()
    life.enter()
    life.enter()

    async def finish_later() -> None:
        await asyncio.sleep(0.05)
        life.leave()
        await asyncio.sleep(0.05)
        life.leave()

    task = asyncio.ensure_future(finish_later())
    assert await life.drain(grace_seconds=5) is True
    assert life.draining and life.count == 0
    await task


async def test_drain_gives_up_after_the_grace_period() -> None:
    life = Lifecycle()
    life.enter()
    assert await life.drain(grace_seconds=0.05) is False
    assert life.count == 1


async def test_idle_server_drains_at_once() -> None:
    assert await Lifecycle().drain(grace_seconds=0) is True
