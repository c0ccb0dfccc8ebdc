"""Loading on request (`--model-control-mode=on_demand`, or a model's `load: on_request`; docs/model-management.md):
a request for a model of the repository that is not loaded waits while it loads, and holds the model until its
response is sent.

* One load per model however many requests arrive at once: the first request starts it, the others wait on the
  same task (LM Studio loaded two copies when first requests raced). Each waiter gives up at its own deadline
  (`model_use.py`: the client's timeout -> 504, else `--load-timeout-secs` -> 503); the load goes on for the
  others and the next request. A failed load answers every waiter with its reason.
* A model is busy while a request holds it (from its lookup until its response has been sent), while its engine
  counts requests in flight, or while requests wait for its load: never evicted (`resident_memory.py`) nor
  expired (`idle_expiry.py`). When busy or pinned models hold the memory budget, a request's load waits (up to
  --load-timeout-secs) until one is idle.

The loads themselves are model control's (`model_control.py`, under its lock): this class decides when.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from gateway.errors import (
    InternalError,
    InvalidRequestError,
    ModelNotFoundError,
    NotFoundError,
    ServiceUnavailableError,
    SwitchyardError,
)
from gateway.repository.loaded_model import LoadedModel
from gateway.repository.model_use import ModelUse, current_use
from gateway.repository.registry import ModelRegistry
from gateway.repository.repository_catalog import RepositoryCatalog
from gateway.repository.resident_memory import ModelTooLargeError, NoRoomError, Resident, ResidentMemory

ROOM_POLL_S = 0.25  # how often a load waiting for room looks again


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
    """What the loader drives: model control's loads (`model_control.ModelControl`) and its catalog."""

    models: ModelRegistry
    catalog: RepositoryCatalog

    def lock(self) -> asyncio.Lock: ...
    async def load_locked(self, name: str, trigger: str) -> LoadedModel: ...


class OnDemandLoader:
    """Loads on request (once per model) for `control`'s models, and lets requests hold what they use (in
    `memory`'s residents). `clock`: recency time (tests pass their own)."""

    def __init__(
        self,
        control: ModelHost,
        memory: ResidentMemory,
        *,
        load_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.control = control
        self.memory = memory
        self.load_timeout_s = load_timeout_s
        self.clock = clock
        self._loads: dict[str, asyncio.Task[LoadedModel]] = {}  # folder -> its load on request, while it runs
        self._waiting: dict[str, int] = {}  # folder -> requests waiting for its load
        self._no_room: dict[str, NoRoomError] = {}  # folder -> why its load is waiting for room, while it waits
        self._started: asyncio.Event | None = None

    def pending(self, folder: str) -> bool:
        """Whether requests wait on `folder`'s load, or its load on request runs (the model is busy)."""
        return self._waiting.get(folder, 0) > 0 or folder in self._loads

    def loading(self, folder: str) -> bool:
        """Whether `folder`'s load on request runs now."""
        return folder in self._loads

    # ------------------------------------------------------------------ requests

    async def acquire(self, name: str, keep_alive: float | None = None) -> LoadedModel:
        """The model serving `name`, loaded first when the repository has it and it loads on request (the request
        waits; at most one load runs per model). `keep_alive`: the request's own (Ollama's), kept from now on by a
        model that loads on request (a model that Triton's modes loaded stays as they keep it).
        The current request (`model_use.py`) holds the model until its response is sent."""
        use = current_use()
        entry = self.control.models.find(name)
        if entry is None:
            folder = self.control.catalog.requestable(name)
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
        resident = self.memory.resident.get(entry.folder)
        if resident is None or resident.entry is not entry:
            return
        resident.last_used = self.clock()
        if keep_alive is not None and self.control.catalog.loads_on_request(entry.folder):
            resident.keep_alive = keep_alive
        if use is not None:
            resident.holds += 1
            use.hold(lambda: self._release(resident))

    def _release(self, resident: Resident) -> None:
        resident.holds -= 1
        resident.last_used = self.clock()
        self.memory.on_change()

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
        for step in self.control.catalog.ensemble_steps(folder):
            if self.control.models.find(step) is None:
                step_folder = self.control.catalog.requestable(step)
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

    # ------------------------------------------------------------------ startup and shutdown

    def starting(self) -> None:
        """On the event loop, before the startup models load: requests that arrive meanwhile wait for them."""
        self._started = asyncio.Event()

    def started(self) -> None:
        """The startup models are loaded: requests load the models they ask for."""
        self._started = self._started or asyncio.Event()
        self._started.set()

    async def stop(self) -> None:
        """Shutdown: cancel the loads on request under way."""
        for task in list(self._loads.values()):
            task.cancel()
        await asyncio.gather(*self._loads.values(), return_exceptions=True)
