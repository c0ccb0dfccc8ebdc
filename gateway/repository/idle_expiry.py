"""Keep-alive expiry: a loaded model idle for longer than its keep-alive unloads (docs/model-management.md). A
negative keep-alive pins a model (never unloaded automatically); busy models (`on_demand.py`) are never idle.
Checked every TICK_S and whenever a model is loaded, unloaded or let go by a request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gateway.repository.resident_memory import ResidentMemory

log = logging.getLogger("switchyard.repository")

TICK_S = 1.0  # how often idle models are checked against their keep-alive


class IdleExpiry:
    """Unloads `memory`'s idle models past their keep-alive, under model control's `lock`; `clock`: the idle time
    (tests pass their own, and call `expire_idle` themselves)."""

    def __init__(self, memory: ResidentMemory, lock: Callable[[], asyncio.Lock], clock: Callable[[], float]) -> None:
        self.memory = memory
        self.lock = lock
        self.clock = clock
        self._wake: asyncio.Event | None = None
        self._reaper: asyncio.Task[None] | None = None

    async def expire_idle(self) -> list[str]:
        """Unload every model idle for longer than its keep-alive; returns their folders."""
        now = self.clock()
        due = []
        for r in list(self.memory.resident.values()):
            if r.pinned:
                continue
            if self.memory.is_busy(r):
                r.last_used = now  # engines count requests without telling us when they end (gRPC, streams)
            elif now - r.last_used >= r.keep_alive:
                due.append(r.folder)
        expired = []
        if due:
            async with self.lock():
                for folder in due:
                    again = self.memory.resident.get(folder)
                    if again is None or self.memory.is_busy(again) or self.clock() - again.last_used < again.keep_alive:
                        continue  # used again, or unloaded, meanwhile
                    await self.memory.evict(folder, "idle")
                    expired.append(folder)
        return expired

    def seconds_left(self, folder: str) -> float | None:
        """How long until the loaded `folder` unloads if no request comes: its keep-alive less its idle time (the
        whole keep-alive while busy: its clock restarts when the last request lets it go); None: pinned, or not
        tracked (never unloaded automatically)."""
        r = self.memory.resident.get(folder)
        if r is None or r.pinned:
            return None
        if self.memory.is_busy(r):
            return r.keep_alive
        return max(0.0, r.keep_alive - (self.clock() - r.last_used))

    def nudge(self) -> None:
        """Check now (a model was loaded, unloaded or let go)."""
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            try:
                async with asyncio.timeout(TICK_S):  # (wait_for can swallow a cancel that meets its timeout)
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.expire_idle()
            except Exception:
                log.exception("keep-alive check failed")

    def start(self) -> None:
        """On the event loop, once the startup models are loaded: idle models expire from now on."""
        self._wake = asyncio.Event()
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._run(), name="model-keep-alive")

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
