"""Which models stay loaded (`--model-control-mode=on_demand`, or a model's `load: on_request`;
docs/model-management.md): loaded by their first request, unloaded once idle past their keep-alive, and evicted,
least recently used first, when the memory budget is short. Three parts, wired here:

* `resident_memory.py`, `ResidentMemory`: the loaded models counted against the memory budget, loads'
  reservations, and which idle model is evicted for room;
* `on_demand.py`, `OnDemandLoader`: one load per model for the requests that ask for it, and the holds that keep a
  model in use busy until its response is sent;
* `idle_expiry.py`, `IdleExpiry`: unloads models idle past their keep-alive.

Loads and unloads themselves are model control's (`model_control.py`, under its lock): these decide when.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from gateway.repository.idle_expiry import IdleExpiry
from gateway.repository.layout import ModelDir
from gateway.repository.lifecycle_config import describe_keep_alive
from gateway.repository.load_peak import load_peak_bytes
from gateway.repository.memory_budget import estimate_bytes, process_rss
from gateway.repository.model_config import AnyModelConfig
from gateway.repository.on_demand import ModelHost, OnDemandLoader
from gateway.repository.resident_memory import ResidentMemory


class ResidencyHost(ModelHost, Protocol):
    """Model control as residency drives it: its loads (`ModelHost`) and its unloads (evictions, expiry)."""

    def unload_locked(self, name: str, reason: str) -> asyncio.Task[None] | None: ...


class Residency:
    """The memory budget, loads on request and keep-alive expiry of `control`'s models.

    `clock`: keep-alive and recency time (tests pass their own); `rss`: the process's resident bytes;
    `estimate`: a model's bytes before loading, `peak`: its load's peak by format (both blocking)."""

    def __init__(
        self,
        control: ResidencyHost,
        *,
        budget: int,
        load_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        rss: Callable[[], int] = process_rss,
        estimate: Callable[[ModelDir, AnyModelConfig], int] = estimate_bytes,
        peak: Callable[[ModelDir, AnyModelConfig], int] = load_peak_bytes,
    ) -> None:
        self.memory = ResidentMemory(
            control.unload_locked, budget=budget, clock=clock, rss=rss, estimate=estimate, peak=peak
        )
        self.on_demand = OnDemandLoader(control, self.memory, load_timeout_s=load_timeout_s, clock=clock)
        self.expiry = IdleExpiry(self.memory, control.lock, clock)
        self.memory.pending = self.on_demand.pending  # a model requests wait on is busy
        self.memory.on_change = self.expiry.nudge  # loaded, unloaded or let go: check the keep-alives now

    def starting(self) -> None:
        """On the event loop, before the startup models load: requests that arrive meanwhile wait for them."""
        self.on_demand.starting()

    def start(self) -> None:
        """On the event loop, once the startup models are loaded: requests may load models, idle ones expire."""
        self.expiry.start()
        self.on_demand.started()

    async def stop(self) -> None:
        await self.expiry.stop()
        await self.on_demand.stop()

    def describe(self, folder: str) -> dict[str, Any]:
        """A folder's residency for /v1/models and the console: counted bytes, keep-alive and when it expires."""
        r = self.memory.resident.get(folder)
        if r is None:
            return {"loading": self.on_demand.loading(folder)}
        busy = self.memory.is_busy(r)
        left = self.expiry.seconds_left(folder)
        return {
            "resident_bytes": r.bytes,
            "keep_alive": describe_keep_alive(r.keep_alive),
            "pinned": r.pinned,
            "busy": busy,
            "expires_in_s": None if busy or left is None else round(left, 1),
        }
