"""Which models stay loaded: loaded by their first request, unloaded once idle past their keep-alive, and evicted,
least recently used first, when the memory budget is short (`--model-control-mode=on_demand`, or a model's
`load: on_request`; docs/model-management.md).

* One load per model however many requests arrive at once: the first request starts it, the others wait on the
  same task (LM Studio loaded two copies when first requests raced). Each waiter gives up at its own deadline
  (`model_use.py`: the client's timeout -> 504, else `--load-timeout-secs` -> 503); the load goes on for the
  others and the next request. A failed load answers every waiter with its reason.
* Idle: a model is busy while a request holds it (from its lookup until its response has been sent), while its
  engine counts requests in flight, or while requests wait for its load. A model idle for longer than its
  keep-alive unloads; a negative keep-alive pins it (never unloaded automatically).
* Budget: before a model loads, its bytes are estimated (`memory_budget.py`) and the larger of that and its load's
  peak is reserved (`load_peak.py`). The memory in use is the larger of the server's RSS and the models' counted
  bytes plus the reservation of a load under way; while it plus the reservation passes the budget, idle unpinned
  models are evicted, least recently used first. Once loaded, the model is counted at its resident bytes. Busy
  and pinned models, and models an ensemble calls, are never evicted; when they hold the rest, a request's load
  waits until one is idle (an admin load is answered 503). A model whose reservation is bigger than the budget
  less what the server holds besides its models is refused with the figures.

Loads and unloads themselves are model control's (`model_control.py`, under its lock): this class decides when.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.errors import (
    ConfigError,
    InternalError,
    InvalidRequestError,
    ModelNotFoundError,
    NotFoundError,
    ServiceUnavailableError,
    SwitchyardError,
)
from gateway.observability.request_metrics import Histogram
from gateway.repository.layout import ModelDir
from gateway.repository.lifecycle_config import describe_keep_alive
from gateway.repository.load_peak import PeakWatch, load_peak_bytes, reservation
from gateway.repository.loaded_model import LoadedModel, LoadedTensorModel
from gateway.repository.memory_budget import estimate_bytes, fmt_bytes, process_rss, reported_bytes
from gateway.repository.model_config import AnyModelConfig
from gateway.repository.model_use import ModelUse, current_use
from gateway.repository.registry import ModelRegistry

log = logging.getLogger("switchyard.repository")

LOAD_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
TICK_S = 1.0  # how often idle models are checked against their keep-alive
ROOM_POLL_S = 0.25  # how often a load waiting for room looks again


class ModelTooLargeError(ServiceUnavailableError):
    """The model cannot fit even with every other model unloaded."""

    code = "insufficient_memory"


class NoRoomError(ServiceUnavailableError):
    """The budget is held by busy or pinned models right now."""

    code = "insufficient_memory"


class ModelLoadingError(ServiceUnavailableError):
    """The model is still loading after --load-timeout-secs."""

    code = "model_loading"


class ModelLoadTimeoutError(SwitchyardError):
    """The request's own timeout passed while its model loaded: 504, as a gateway whose upstream is late."""

    status = 504
    type = "timeout_error"
    code = "model_load_timeout"


class ModelLoadFailedError(InternalError):
    code = "model_load_failed"


class ModelHost(Protocol):
    """What the manager drives: model control's loads and unloads (`model_control.ModelControl`)."""

    models: ModelRegistry

    def lock(self) -> asyncio.Lock: ...
    def requestable(self, name: str) -> str | None: ...
    def loads_on_request(self, folder: str) -> bool: ...
    def ensemble_steps(self, folder: str) -> list[str]: ...
    async def load_locked(self, name: str, trigger: str) -> LoadedModel: ...
    def unload_locked(self, name: str, reason: str) -> asyncio.Task[None] | None: ...


@dataclass
class Resident:
    """A loaded model copy as the manager tracks it: its keep-alive (seconds, < 0: pinned), counted bytes, when a
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


class ResidencyStats:
    """Counters for /metrics, as plain numbers read at scrape time (gateway/repository/residency_metrics.py)."""

    def __init__(self) -> None:
        self.loads: dict[tuple[str, str], int] = {}  # (model folder, success|failure) -> count
        self.unloads: dict[tuple[str, str], int] = {}  # (folder, reason: idle|memory|admin|poll|failed) -> count
        self.evictions: dict[tuple[str, str], int] = {}  # (folder, reason: idle|memory) -> count
        self.load_seconds: dict[str, Histogram] = {}  # folder -> histogram of successful loads' durations

    @staticmethod
    def count(table: dict[tuple[str, str], int], folder: str, label: str) -> None:
        table[(folder, label)] = table.get((folder, label), 0) + 1

    def loaded(self, folder: str, seconds: float) -> None:
        self.count(self.loads, folder, "success")
        self.load_seconds.setdefault(folder, Histogram(LOAD_SECONDS_BUCKETS)).observe(seconds)


class Residency:
    """Loads on request (once), keep-alive expiry and LRU eviction under a memory budget, for `control`'s models.

    `clock`: keep-alive and recency time (tests pass their own); `rss`: the process's resident bytes;
    `estimate`: a model's bytes before loading, `peak`: its load's peak by format (both blocking)."""

    def __init__(
        self,
        control: ModelHost,
        *,
        budget: int,
        default_keep_alive: float = 300.0,
        load_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        rss: Callable[[], int] = process_rss,
        estimate: Callable[[ModelDir, AnyModelConfig], int] = estimate_bytes,
        peak: Callable[[ModelDir, AnyModelConfig], int] = load_peak_bytes,
    ) -> None:
        self.control = control
        self.budget = budget
        self.default_keep_alive = default_keep_alive
        self.load_timeout_s = load_timeout_s
        self.clock = clock
        self.rss = rss
        self._estimate = estimate
        self._peak = peak
        self.peaks: dict[str, int] = {}  # model folder -> the RSS growth measured at the peak of its last load
        self.reserved: dict[str, int] = {}  # model folder -> bytes reserved for its load, while it runs
        self.resident: dict[str, Resident] = {}  # model folder -> its loaded copy
        self.stats = ResidencyStats()
        self._loads: dict[str, asyncio.Task[LoadedModel]] = {}  # folder -> its load on request, while it runs
        self._waiting: dict[str, int] = {}  # folder -> requests waiting for its load
        self._no_room: dict[str, NoRoomError] = {}  # folder -> why its load is waiting for room, while it waits
        self._wake: asyncio.Event | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._started: asyncio.Event | None = None

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

    def is_busy(self, resident: Resident) -> bool:
        return (
            resident.holds > 0
            or resident.entry.in_flight > 0
            or self._waiting.get(resident.folder, 0) > 0
            or resident.folder in self._loads
        )

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
        self._nudge()

    def forget(self, folder: str, reason: str) -> None:
        """`folder`'s copy was taken out of service (unloaded, evicted, removed)."""
        if self.resident.pop(folder, None) is not None:
            ResidencyStats.count(self.stats.unloads, folder, reason)
        self._nudge()

    def load_failed(self, folder: str) -> None:
        ResidencyStats.count(self.stats.loads, folder, "failure")

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
        task = self.control.unload_locked(folder, reason)
        if task is not None:
            await asyncio.shield(task)  # its stop collects and trims the heap (heap.collect_retired)

    # ------------------------------------------------------------------ requests

    async def acquire(self, name: str, keep_alive: float | None = None) -> LoadedModel:
        """The model serving `name`, loaded first when the repository has it and it loads on request (the request
        waits; at most one load runs per model). `keep_alive`: the request's own (Ollama's), kept from now on by a
        model that loads on request (a model that Triton's modes loaded stays as they keep it).
        The current request (`model_use.py`) holds the model until its response is sent."""
        use = current_use()
        entry = self.control.models.find(name)
        if entry is None:
            folder = self.control.requestable(name)
            if folder is None:
                raise ModelNotFoundError(name)
            self._waiting[folder] = self._waiting.get(folder, 0) + 1
            try:
                entry = await self._wait_for_load(folder, name, use)
                self._hold(entry, use, keep_alive)
            finally:
                self._waiting[folder] -= 1
                if not self._waiting[folder]:
                    del self._waiting[folder]
            return entry
        self._hold(entry, use, keep_alive)
        return entry

    def _hold(self, entry: LoadedModel, use: ModelUse | None, keep_alive: float | None) -> None:
        resident = self.resident.get(entry.folder)
        if resident is None or resident.entry is not entry:
            return
        resident.last_used = self.clock()
        if keep_alive is not None and self.control.loads_on_request(entry.folder):
            resident.keep_alive = keep_alive
        if use is not None:
            resident.holds += 1
            use.hold(lambda: self._release(resident))

    def _release(self, resident: Resident) -> None:
        resident.holds -= 1
        resident.last_used = self.clock()
        self._nudge()

    async def _wait_for_load(self, folder: str, name: str, use: ModelUse | None) -> LoadedModel:
        started = time.monotonic()
        server_deadline = started + self.load_timeout_s
        client_deadline = use.deadline if use is not None else None
        deadline = min(server_deadline, client_deadline or server_deadline)
        if self._started is not None and not self._started.is_set():  # startup loads first: no double load
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await self._started.wait()
            except TimeoutError:
                pass
            entry = self.control.models.find(name)
            if entry is not None:
                return entry
        task = self._loads.get(folder)
        if task is None:
            task = asyncio.create_task(self._load_on_request(folder), name=f"load-{folder}")
            self._loads[folder] = task
            task.add_done_callback(lambda done: self._load_done(folder, done))
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                return await asyncio.shield(task)  # a waiter that gives up leaves the load to the others
        except TimeoutError:
            waited = time.monotonic() - started
            no_room = self._no_room.get(folder)
            if client_deadline is not None and client_deadline <= server_deadline:
                why = f" ({no_room.message})" if no_room else ""
                raise ModelLoadTimeoutError(
                    f"model '{name}' did not finish loading within the request's timeout ({waited:.1f}s){why}; it "
                    "goes on loading: retry shortly, or give the request a longer timeout"
                ) from None
            if no_room is not None:
                raise NoRoomError(no_room.message, headers=no_room.headers) from None
            raise ModelLoadingError(
                f"model '{name}' is still loading after {waited:.0f}s (--load-timeout-secs); retry shortly",
                headers={"Retry-After": "5"},
            ) from None

    def _load_done(self, folder: str, task: asyncio.Task[LoadedModel]) -> None:
        if self._loads.get(folder) is task:
            del self._loads[folder]
            self._no_room.pop(folder, None)
        if not task.cancelled():
            task.exception()  # retrieved: the waiters have it (or had it, and went away)

    async def _load_on_request(self, folder: str) -> LoadedModel:
        """Load `folder` for the requests waiting on it: the models an ensemble calls first, then the folder,
        waiting (up to --load-timeout-secs) while busy models hold the budget."""
        deadline = time.monotonic() + self.load_timeout_s
        for step in self.control.ensemble_steps(folder):
            if self.control.models.find(step) is None:
                step_folder = self.control.requestable(step)
                if step_folder is None:
                    raise ModelLoadFailedError(
                        f"failed to load '{folder}': its ensemble step '{step}' is not a "
                        "model of the repository that loads on request"
                    )
                await self._load_on_request(step_folder)
        while True:
            try:
                async with self.control.lock():
                    entry = self.control.models.in_folder(folder)
                    if entry is not None:
                        return entry
                    return await self.control.load_locked(folder, trigger="request")
            except NoRoomError as exc:
                self._no_room[folder] = exc
                if time.monotonic() + ROOM_POLL_S > deadline:
                    raise
            except (ModelTooLargeError, ModelNotFoundError):
                raise
            except NotFoundError:
                raise ModelNotFoundError(folder) from None
            except (InvalidRequestError, InternalError) as exc:  # the load failed: every waiter gets the reason
                raise ModelLoadFailedError(exc.message) from None
            await asyncio.sleep(ROOM_POLL_S)

    # ------------------------------------------------------------------ keep-alive

    async def expire_idle(self) -> list[str]:
        """Unload every model idle for longer than its keep-alive; returns their folders."""
        now = self.clock()
        due = []
        for r in list(self.resident.values()):
            if r.pinned:
                continue
            if self.is_busy(r):
                r.last_used = now  # engines count requests without telling us when they end (gRPC, streams)
            elif now - r.last_used >= r.keep_alive:
                due.append(r.folder)
        expired = []
        if due:
            async with self.control.lock():
                for folder in due:
                    again = self.resident.get(folder)
                    if again is None or self.is_busy(again) or self.clock() - again.last_used < again.keep_alive:
                        continue  # used again, or unloaded, meanwhile
                    await self.evict(folder, "idle")
                    expired.append(folder)
        return expired

    def _nudge(self) -> None:
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
        """On the event loop, once the startup models are loaded: requests may load models, idle ones expire."""
        self._wake = asyncio.Event()
        self._started = self._started or asyncio.Event()
        self._started.set()
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._run(), name="model-keep-alive")

    def starting(self) -> None:
        """On the event loop, before the startup models load: requests that arrive meanwhile wait for them."""
        self._started = asyncio.Event()

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        for task in list(self._loads.values()):
            task.cancel()
        await asyncio.gather(*self._loads.values(), return_exceptions=True)

    # ------------------------------------------------------------------ what the listings show

    def seconds_left(self, folder: str) -> float | None:
        """How long until the loaded `folder` unloads if no request comes: its keep-alive less its idle time (the
        whole keep-alive while busy: its clock restarts when the last request lets it go); None: pinned, or not
        tracked (never unloaded automatically)."""
        r = self.resident.get(folder)
        if r is None or r.pinned:
            return None
        if self.is_busy(r):
            return r.keep_alive
        return max(0.0, r.keep_alive - (self.clock() - r.last_used))

    def describe(self, folder: str) -> dict[str, Any]:
        """A folder's residency for /v1/models and the console: counted bytes, keep-alive and when it expires."""
        r = self.resident.get(folder)
        if r is None:
            return {"loading": folder in self._loads}
        left = None if r.pinned else max(0.0, r.keep_alive - (self.clock() - r.last_used))
        return {
            "resident_bytes": r.bytes,
            "keep_alive": describe_keep_alive(r.keep_alive),
            "pinned": r.pinned,
            "busy": self.is_busy(r),
            "expires_in_s": None if self.is_busy(r) or left is None else round(left, 1),
        }
