"""The loaded models against the memory budget (`--memory-budget`; docs/model-management.md): what each counts, what
a load reserves, and which idle model is evicted, least recently used first, to make room.

Before a model loads, its bytes are estimated (`memory_budget.py`) and the larger of that and its load's peak is
reserved (`load_peak.py`). The memory in use is the larger of the server's RSS and the models' counted bytes plus
the reservation of a load under way; while it plus the reservation passes the budget, idle unpinned models are
evicted, least recently used first. Once loaded, the model is counted at its resident bytes. Busy and pinned
models, and models an ensemble calls, are never evicted; when they hold the rest, the load is refused for now
(`NoRoomError`: a request's load waits and tries again, `on_demand.py`). A model whose reservation is bigger than
the budget less what the server holds besides its models is refused with the figures.

Evictions unload through model control (`model_control.py`, under its lock): this class decides which.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gateway.errors import ConfigError, ServiceUnavailableError
from gateway.repository.layout import ModelDir
from gateway.repository.lifecycle_config import describe_keep_alive
from gateway.repository.load_peak import PeakWatch, load_peak_bytes, reservation
from gateway.repository.loaded_model import LoadedModel, LoadedTensorModel
from gateway.repository.memory_budget import estimate_bytes, fmt_bytes, process_rss, reported_bytes
from gateway.repository.model_config import AnyModelConfig
from gateway.repository.residency_metrics import ResidencyStats

log = logging.getLogger("switchyard.repository")

#: Model control's unload of a folder for a reason (under its lock): the stopping copy's task, or None.
Unload = Callable[[str, str], asyncio.Task[None] | None]


class ModelTooLargeError(ServiceUnavailableError):
    """The model cannot fit even with every other model unloaded."""

    code = "insufficient_memory"


class NoRoomError(ServiceUnavailableError):
    """The budget is held by busy or pinned models right now."""

    code = "insufficient_memory"


@dataclass
class Resident:
    """A loaded model copy as the budget tracks it: its keep-alive (seconds, < 0: pinned), counted bytes, when a
    request last used it, and how many requests hold it now."""

    folder: str
    entry: LoadedModel
    keep_alive: float
    bytes: int
    estimated: int
    last_used: float
    holds: int = 0

    @property
    def pinned(self) -> bool:
        return self.keep_alive < 0


class ResidentMemory:
    """The loaded models (`resident`) counted against `budget` bytes, loads' reservations, and evictions.

    `unload`: model control's unload (an eviction); `clock`: recency time (tests pass their own); `rss`: the
    process's resident bytes; `estimate`: a model's bytes before loading, `peak`: its load's peak by format (both
    blocking). Two hooks the on-demand loader and the keep-alive set: `pending(folder)`, whether requests wait on
    the folder's load (busy), and `on_change()`, called when a model is tracked, forgotten or let go."""

    def __init__(
        self,
        unload: Unload,
        *,
        budget: int,
        clock: Callable[[], float],
        rss: Callable[[], int] = process_rss,
        estimate: Callable[[ModelDir, AnyModelConfig], int] = estimate_bytes,
        peak: Callable[[ModelDir, AnyModelConfig], int] = load_peak_bytes,
    ) -> None:
        self.unload = unload
        self.budget = budget
        self.clock = clock
        self.rss = rss
        self._estimate = estimate
        self._peak = peak
        self.peaks: dict[str, int] = {}  # model folder -> the RSS growth measured at the peak of its last load
        self.reserved: dict[str, int] = {}  # model folder -> bytes reserved for its load, while it runs
        self.resident: dict[str, Resident] = {}  # model folder -> its loaded copy
        self.stats = ResidencyStats()
        self.pending: Callable[[str], bool] = lambda folder: False
        self.on_change: Callable[[], None] = lambda: None

    # ------------------------------------------------------------------ accounting

    def counted_bytes(self) -> int:
        return sum(r.bytes for r in self.resident.values())

    def used_bytes(self) -> int:
        """Memory in use: the server's RSS, or the models' counted bytes and the reservation of a load under way
        where they say more (a KV pool is counted whole before requests fault it in)."""
        return max(self.rss(), self.counted_bytes() + sum(self.reserved.values()))

    def overhead_bytes(self) -> int:
        """What the server holds besides its models."""
        return max(0, self.rss() - self.counted_bytes())

    def estimate(self, model: ModelDir, config: AnyModelConfig) -> int:
        """A model's bytes before loading (blocking); 0 where the files cannot tell (the load then says why)."""
        try:
            return int(self._estimate(model, config))
        except ConfigError:
            raise
        except Exception:  # noqa: BLE001 - an estimate only: a broken file fails the load itself, with its reason
            log.debug("model '%s': no memory estimate", model.name, exc_info=True)
            return 0

    def reserve_for(self, model: ModelDir, config: AnyModelConfig, estimated: int) -> int:
        """What to reserve before `model` loads (blocking): the larger of its resident estimate and its load's peak,
        as measured at its last load or else estimated by format (load_peak.py)."""
        measured = self.peaks.get(model.name)
        if measured is not None:
            return reservation(estimated, 0, measured)
        try:
            peak = int(self._peak(model, config))
        except Exception:  # noqa: BLE001 - an estimate only, as `estimate`
            log.debug("model '%s': no load peak estimate", model.name, exc_info=True)
            peak = 0
        return reservation(estimated, peak, None)

    @contextlib.contextmanager
    def loading(self, folder: str, reserved: int) -> Iterator[None]:
        """Hold `reserved` bytes of the budget for `folder` while it loads, and record its load's measured peak
        (used for its next load's reservation); the reservation is released when the load ends."""
        self.reserved[folder] = reserved
        try:
            with PeakWatch(self.rss) as watch:
                yield
            self.peaks[folder] = watch.growth
            log.info(
                "model '%s': its load took %s at its peak (reserved %s)",
                folder,
                fmt_bytes(watch.growth),
                fmt_bytes(reserved),
            )
        finally:
            self.reserved.pop(folder, None)

    # ------------------------------------------------------------------ model control's hooks

    def track(self, entry: LoadedModel, keep_alive: float, estimated: int, rss_before: int, seconds: float) -> None:
        """A copy of `entry.folder` was published: count it (the engine's own figure, else the larger of the
        estimate and what the RSS grew by) and start its idle clock."""
        reported = reported_bytes(entry)
        grown = max(0, self.rss() - rss_before)
        counted = reported if reported is not None else max(estimated, grown)
        self.resident[entry.folder] = Resident(entry.folder, entry, keep_alive, counted, estimated, self.clock())
        self.stats.loaded(entry.folder, seconds)
        log.info(
            "model '%s' resident: %s counted (estimated %s, RSS grew %s), keep-alive %s; memory in use %s "
            "of the %s budget",
            entry.folder,
            fmt_bytes(counted),
            fmt_bytes(estimated),
            fmt_bytes(grown),
            describe_keep_alive(keep_alive),
            fmt_bytes(self.used_bytes()),
            fmt_bytes(self.budget),
        )
        self.on_change()

    def forget(self, folder: str, reason: str) -> None:
        """`folder`'s copy was taken out of service (unloaded, evicted, removed)."""
        if self.resident.pop(folder, None) is not None:
            ResidencyStats.count(self.stats.unloads, folder, reason)
        self.on_change()

    def load_failed(self, folder: str) -> None:
        ResidencyStats.count(self.stats.loads, folder, "failure")

    # ------------------------------------------------------------------ room

    def is_busy(self, resident: Resident) -> bool:
        return resident.holds > 0 or resident.entry.in_flight > 0 or self.pending(resident.folder)

    def _ensemble_steps(self) -> set[str]:
        """Folders of the models a loaded ensemble calls (never evicted while it is loaded)."""
        steps: set[str] = set()
        for r in self.resident.values():
            if isinstance(r.entry, LoadedTensorModel) and r.entry.config.ensemble_scheduling is not None:
                steps.update(step.model_name for step in r.entry.config.ensemble_scheduling.step)
        return steps

    def lru_victim(self, exclude: str = "") -> str | None:
        """The least recently used model that may be evicted now (idle, unpinned, called by no ensemble), or None."""
        protected = self._ensemble_steps()
        idle = [
            r
            for r in self.resident.values()
            if r.folder != exclude and not r.pinned and not self.is_busy(r) and r.folder not in protected
        ]
        return min(idle, key=lambda r: r.last_used).folder if idle else None

    def fits_alone(self, folder: str, needed: int) -> None:
        """Refuse a model that cannot fit even with every other model unloaded, with the figures."""
        overhead = self.overhead_bytes()
        if overhead + needed > self.budget:
            raise ModelTooLargeError(
                f"model '{folder}' needs about {fmt_bytes(needed)} of memory to load (needed: {needed} bytes; the "
                "larger of its resident size and its load's peak) but the memory "
                f"budget is {fmt_bytes(self.budget)} (budget: {self.budget} bytes), of which the server holds "
                f"{fmt_bytes(overhead)} besides its models; raise --memory-budget, or serve a smaller form of the "
                "model (a quantized GGUF, bfloat16, a smaller kv_cache.max_tokens)"
            )

    def fits_beside(self, folder: str, needed: int) -> None:
        """At startup (nothing is evicted): refuse a model that does not fit beside the ones loaded before it."""
        self.fits_alone(folder, needed)
        free = self.budget - self.used_bytes()
        if needed > free:
            raise ModelTooLargeError(
                f"model '{folder}' needs about {fmt_bytes(needed)} but the models loaded before it leave "
                f"{fmt_bytes(max(free, 0))} of the {fmt_bytes(self.budget)} memory budget; raise --memory-budget, "
                "or let it load on request (load: on_request) so that idle models make room"
            )

    async def make_room(self, folder: str, needed: int) -> None:
        """Evict idle models, least recently used first, until `needed` more bytes fit (call under model control's
        lock, before loading a folder that is not loaded). NoRoomError when busy or pinned models hold the rest."""
        self.fits_alone(folder, needed)
        while self.used_bytes() + needed > self.budget:
            victim = self.lru_victim(exclude=folder)
            if victim is None:
                holders = ", ".join(sorted(r.folder for r in self.resident.values() if r.folder != folder)) or "none"
                raise NoRoomError(
                    f"model '{folder}' needs about {fmt_bytes(needed)} but {fmt_bytes(self.used_bytes())} of the "
                    f"{fmt_bytes(self.budget)} memory budget is in use and the models holding it are busy or pinned "
                    f"({holders}); retry once they are idle",
                    headers={"Retry-After": "5"},
                )
            await self.evict(victim, "memory")

    async def settle(self, folder: str) -> None:
        """After a load whose estimate was low: evict idle models until the memory in use is within the budget."""
        while self.used_bytes() > self.budget:
            victim = self.lru_victim(exclude=folder)
            if victim is None:
                log.warning(
                    "memory in use %s is above the budget %s and no idle model can be evicted",
                    fmt_bytes(self.used_bytes()),
                    fmt_bytes(self.budget),
                )
                return
            await self.evict(victim, "memory")

    async def evict(self, folder: str, reason: str) -> None:
        """Unload an idle model (call under model control's lock); returns once its copy has stopped."""
        resident = self.resident.get(folder)
        why = (
            "idle for longer than its keep-alive " + describe_keep_alive(resident.keep_alive)
            if reason == "idle" and resident
            else "the memory budget needs its room (least recently used)"
        )
        log.info("unloading model '%s': %s", folder, why)
        ResidencyStats.count(self.stats.evictions, folder, reason)
        task = self.unload(folder, reason)
        if task is not None:
            await asyncio.shield(task)  # its stop collects and trims the heap (heap.collect_retired)
