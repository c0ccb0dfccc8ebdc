"""Copies of a model taken out of service, by a reload (replaced by a new copy) or an unload: each finishes the
requests it has in flight, then stops, in the background; the new copy serves meanwhile (`serving.py`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gateway.repository.heap import collect_retired
from gateway.repository.loaded_model import LoadedModel

log = logging.getLogger("switchyard.repository")


class Retirement:
    """Copies taken out of service (replaced by a reload, or unloaded): each finishes its requests in the background
    (at most `drain_timeout_s`), then stops; `on_stopped(old, successor)` is called once it has."""

    def __init__(
        self, drain_timeout_s: float, on_stopped: Callable[[LoadedModel, LoadedModel | None], None] | None = None
    ) -> None:
        self.drain_timeout_s = drain_timeout_s
        self.on_stopped = on_stopped
        self.tasks: set[asyncio.Task[None]] = set()

    def retire(self, old: LoadedModel, successor: LoadedModel | None) -> asyncio.Task[None]:
        task = asyncio.create_task(self.drain_and_stop(old, successor), name=f"retire-{old.name}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        # Collected once the task's frame, the last holder of the old copy, is gone: collected from inside it, the
        # copy survived, was frozen again with the survivors and was never freed (a whole model a reload).
        task.add_done_callback(lambda _: collect_retired())
        return task

    async def drain_and_stop(self, old: LoadedModel, successor: LoadedModel | None) -> None:
        old.retire(successor)
        try:
            if old.in_flight:
                await asyncio.wait_for(old.wait_idle(), self.drain_timeout_s)
        except TimeoutError:
            log.warning(
                "model '%s': %d request(s) still running after %gs of draining; stopping them",
                old.name,
                old.in_flight,
                self.drain_timeout_s,
            )
        finally:
            await stop_quietly(old)
            if self.on_stopped is not None:
                self.on_stopped(old, successor)

    async def close(self) -> None:
        """Shutdown: give the copies still draining their time, then cancel what is left."""
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=self.drain_timeout_s)
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)


async def stop_quietly(entry: LoadedModel) -> None:
    try:
        await entry.stop()
    except Exception:
        log.exception("model '%s' did not stop cleanly", entry.name)
