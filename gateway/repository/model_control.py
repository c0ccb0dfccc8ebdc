"""Model lifecycle: what loads, unloads and reloads, and in which state each model folder is (each model is built
by `builder.py` and published in the `ModelRegistry` the frontends read). Which models load, and when, follows
Triton's model control modes (`--model-control-mode`):

* `none`: every model loads at startup; the repository API's load/unload is refused.
* `explicit`: only `--load-model` models load at startup (`*` = all); the repository API loads and unloads.
* `poll`: every model loads at startup, then `watcher.RepositoryWatcher` applies the repository's changes;
  the repository API's load/unload is refused.
* `on_demand` (Switchyard's, as Ollama does): a model loads when the first request for it arrives, unloads once
  idle past its keep-alive, and is evicted (least recently used first) when the memory budget needs its room; the
  repository API loads and unloads too. `residency.py` decides when; this class does the loads and unloads.

In every mode a model whose config says `load: on_request` loads on its first request, and `load: on_startup`
loads at startup; which folders those are, and their configs, is the catalog's (`repository_catalog.py`). A model
that fails to load at startup is reported (its state and reason in the repository index) and the others serve,
unless `--exit-on-error` asks to stop.

A reload builds and starts the new copy while the old one serves, swaps them, and stops the old copy only once
its in-flight requests have finished (`retirement.py`, `serving.py`); a failed reload leaves the old copy serving.
A failed load keeps its reason in the folder's state (`model_states.py`), which the load API's error, the
repository index and the console show.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.errors import (
    ConfigError,
    InternalError,
    InvalidRequestError,
    NotFoundError,
    ServiceUnavailableError,
    SwitchyardError,
)
from gateway.repository.builder import build_model
from gateway.repository.cpu_plan import cpu_share
from gateway.repository.layout import ModelDir, folder_fingerprint, is_valid_model_name, resolve_source, scan_repository
from gateway.repository.loaded_model import LoadedModel
from gateway.repository.memory_budget import default_budget
from gateway.repository.model_config import AnyModelConfig, ModelConfig, parse_model_config
from gateway.repository.model_states import ModelStates
from gateway.repository.registry import ModelRegistry
from gateway.repository.repository_catalog import ControlMode, RepositoryCatalog
from gateway.repository.residency import Residency
from gateway.repository.resident_memory import ModelTooLargeError
from gateway.repository.retirement import Retirement, stop_quietly
from gateway.repository.tensor_config import TensorModelConfig

if TYPE_CHECKING:
    from gateway.repository.watcher import RepositoryWatcher
    from gateway.scheduler.tensor.rate_limiter import RateLimiter

log = logging.getLogger("switchyard.repository")

#: Triton's words when the repository API is off (its tools and scripts look for them).
CONTROL_DISABLED = "explicit model load / unload is not allowed if polling is enabled"
DRAIN_TIMEOUT_S = 30.0


class ModelControlDisabledError(ServiceUnavailableError):
    """Load/unload through the repository API in the `none` or `poll` mode: 503 (UNAVAILABLE), as Triton."""

    code = "model_control_disabled"


class ModelControl:
    """Loads, unloads and reloads the repository's models into `models`, and keeps each folder's state."""

    def __init__(
        self,
        root: Path,
        cache_dir: Path | None = None,
        *,
        control_mode: ControlMode = "none",
        load_models: Iterable[str] = (),
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
        rate_limiter: RateLimiter | None = None,
        models: ModelRegistry | None = None,
        memory_budget: int | None = None,
        keep_alive_s: float = 300.0,
        load_timeout_s: float = 600.0,
        exit_on_error: bool = False,
        residency: dict[str, Any] | None = None,
        lora_dirs: Iterable[Path] = (),
    ) -> None:
        """`memory_budget`: bytes (None: the cgroup's or the machine's memory); `keep_alive_s`: idle time before a
        model loaded on request unloads; `load_timeout_s`: how long a request waits for its model to load;
        `exit_on_error`: a model failing at startup fails the server; `residency`: Residency's test hooks (clock,
        rss, estimate)."""
        self.root = root
        self.models = models if models is not None else ModelRegistry()
        self.rate_limiter = rate_limiter  # the server's --rate-limit, given to every tensor model it loads
        self.cache_dir = cache_dir
        self.control_mode = control_mode
        self._parsed: list[tuple[ModelDir, AnyModelConfig]] | None = None
        self.states = ModelStates(root, self.models)  # each folder's state, and the repository index
        self.catalog = RepositoryCatalog(  # which folders load when, and their configs
            root,
            control_mode=control_mode,
            load_models=load_models,
            default_keep_alive=keep_alive_s,
            public=self.states.public,
        )
        self._fingerprints: dict[str, str] = {}  # folder name -> its files when its last load began (polling)
        self.retiring = Retirement(drain_timeout_s, self._retired)  # old copies finishing their requests
        self._watcher: RepositoryWatcher | None = None  # poll mode
        self._lock: asyncio.Lock | None = None
        self.exit_on_error = exit_on_error
        if memory_budget is None:
            memory_budget = default_budget().bytes
        self.residency = Residency(self, budget=memory_budget, load_timeout_s=load_timeout_s, **(residency or {}))
        self.models.on_demand = self.residency.on_demand  # requests for models not loaded wait for their load
        self.lora_dirs = tuple(lora_dirs)  # --lora-dir: where LoRA adapters may be loaded from (adapter_catalog.py)

    # ------------------------------------------------------------------ startup

    def _startup_failed(self, name: str, step: str, exc: BaseException) -> None:
        """A model failed at startup: stop the server (--exit-on-error) or record why and serve the others."""
        if self.exit_on_error:
            reason = str(exc) if isinstance(exc, ConfigError) else self.states.reason(exc)
            raise ConfigError(
                f"model '{name}' failed to {step}: {reason} (--exit-on-error stops the server; "
                "fix the model, or drop --exit-on-error to serve the others)"
            ) from None
        self._failed(name, None, step, exc)

    def prepare(self) -> None:
        """Parse and check the startup models' configs without loading weights, so config errors surface before
        serving (a model with a bad config is reported and left out, or stops the server with --exit-on-error).
        In explicit mode without --load-model nothing loads at startup; models that load on request are listed."""
        parsed = []
        named = self.catalog.named_at_startup()
        for model in self.catalog.startup_models():
            self._fingerprints[model.name] = folder_fingerprint(model.path)
            try:
                config = parse_model_config(model.config_path, model.name)
                if not named and not self.catalog.loads_at_startup(config):
                    continue  # loads on its first request
                local = config.backend == "pytorch" if isinstance(config, ModelConfig) else bool(config.model.source)
                if local:  # weights in the folder or a package: checked before anything loads
                    resolve_source(model, config.model.source, "model.source")
            except ConfigError as exc:
                self._startup_failed(model.name, "load", exc)
                continue
            parsed.append((model, config))
        self._parsed = parsed
        self.catalog.refresh()

    def _build(self, model: ModelDir, config: AnyModelConfig) -> LoadedModel:
        """Load one model (blocking), on its share of the CPU budget among the repository's models."""
        share = cpu_share(scan_repository(self.root) if self.root.is_dir() else [], model.name, config)
        return build_model(model, config, self.cache_dir, self.models, self.rate_limiter, self.lora_dirs, share)

    def load_all(self) -> list[LoadedModel]:
        """Load each startup model's weights and build its scheduler (blocking; call off the event loop).

        Ensembles load last, so the models they call are there first."""
        if self._parsed is None:
            self.prepare()
        assert self._parsed is not None
        ordered = sorted(
            self._parsed, key=lambda mc: isinstance(mc[1], TensorModelConfig) and mc[1].resolved_backend == "ensemble"
        )
        loaded = []
        memory = self.residency.memory
        for model, config in ordered:
            try:
                needed = memory.estimate(model, config)
                reserved = memory.reserve_for(model, config, needed)
                memory.fits_beside(model.name, reserved)
                rss_before, started = memory.rss(), time.monotonic()
                with memory.loading(model.name, reserved):
                    entry = self._build(model, config)
            except Exception as exc:
                self._startup_failed(model.name, "load", exc)
                continue
            self.models.publish(entry)
            self.states.set(model.name, "READY")
            memory.track(entry, self.catalog.keep_alive_for(config), needed, rss_before, time.monotonic() - started)
            loaded.append(entry)
        return loaded

    async def start_all(self, loaded: list[LoadedModel]) -> list[LoadedModel]:
        """Start the startup models' schedulers (on the event loop); one that fails is withdrawn and reported, or
        stops the server with --exit-on-error. Then requests may load models and idle ones expire."""
        started = []
        for entry in loaded:
            try:
                await entry.start()
            except Exception as exc:
                await stop_quietly(entry)
                self.models.withdraw(entry)
                self.residency.memory.forget(entry.folder, "failed")
                self._startup_failed(entry.folder, "start", exc)
                continue
            started.append(entry)
        self.residency.start()
        return started

    # ------------------------------------------------------------------ repository API (event loop)

    def lock(self) -> asyncio.Lock:
        """The lock every load and unload runs under (the residency manager's loads and evictions take it too)."""
        self._lock = self._lock or asyncio.Lock()
        return self._lock

    def _check_control(self) -> None:
        if self.control_mode in ("explicit", "on_demand"):
            return
        how = (
            "the repository is polled: add, change or remove model folders instead"
            if self.control_mode == "poll"
            else "start the server with --model-control-mode=explicit to load and unload models through this API"
        )
        raise ModelControlDisabledError(f"{CONTROL_DISABLED} (model control mode is '{self.control_mode}'; {how})")

    async def load(
        self, name: str, config_override: dict[str, Any] | None = None, keep_alive: float | None = None
    ) -> LoadedModel:
        """Load (or reload) a model by folder name (explicit and on_demand modes). In-flight requests finish on the
        old copy. `keep_alive`: this copy's (-1 pins it); else its config's, or for a model that loads on request
        the server's --keep-alive, counted from this load (docs/model-management.md)."""
        self._check_control()
        async with self.lock():
            return await self._load_folder(name, config_override, keep_alive=keep_alive, trigger="admin")

    async def unload(self, name: str) -> None:
        """Unload a model by folder name (explicit mode); returns once its in-flight requests have finished."""
        self._check_control()
        async with self.lock():
            self.catalog.find(name)
            task = self._unload_folder(name, "admin")
        if task is not None:
            await asyncio.shield(task)  # the unload completes even if the caller goes away

    async def load_locked(self, name: str, trigger: str) -> LoadedModel:
        """Load a folder for the residency manager (which holds the lock)."""
        return await self._load_folder(name, trigger=trigger)

    async def _load_folder(
        self,
        name: str,
        config_override: dict[str, Any] | None = None,
        fingerprint: str | None = None,
        keep_alive: float | None = None,
        trigger: str = "admin",
    ) -> LoadedModel:
        """Build and start a new copy while the old one (if any) serves, then swap them (call under the lock). A
        folder not loaded yet first gets its room in the memory budget (idle models evicted, `resident_memory.py`)."""
        model = self.catalog.find(name)
        if not fingerprint:
            fingerprint = await asyncio.to_thread(folder_fingerprint, model.path)
        self._fingerprints[name] = fingerprint
        old = self.models.in_folder(name)
        memory = self.residency.memory
        needed = reserved = 0
        try:
            config = self.catalog.read_config(model, config_override)
            served = (config.served_model_name if isinstance(config, ModelConfig) else None) or name
            other = self.models.find(served)
            if other is not None and other.folder != name:
                raise ConfigError(
                    f"{model.config_path}: the served name '{served}' is taken by the model folder "
                    f"'{other.folder}'; choose another served_model_name."
                )
            if old is None:
                needed = await asyncio.to_thread(memory.estimate, model, config)
                reserved = await asyncio.to_thread(memory.reserve_for, model, config, needed)
        except Exception as exc:
            raise self._failed(name, old, "load", exc) from None
        if old is None:
            try:
                await memory.make_room(name, reserved)
            except ModelTooLargeError as exc:
                memory.load_failed(name)
                self.states.set(name, "UNAVAILABLE", exc.message)
                log.error("model '%s' failed to load: %s", name, exc.message)
                raise
        rss_before, started = memory.rss(), time.monotonic()
        with memory.loading(name, reserved):  # the build and the engine's start (its KV pool, workers)
            try:
                if old is None:
                    self.states.set(name, "LOADING")
                if trigger == "request":
                    log.info("model '%s' was asked for: loading it on request", name)
                entry = await asyncio.to_thread(self._build, model, config)
            except Exception as exc:
                raise self._failed(name, old, "load", exc) from None
            try:
                await entry.start()
            except Exception as exc:
                await stop_quietly(entry)
                raise self._failed(name, old, "start", exc) from None
        self.models.publish(entry, replaces=old)  # the swap: new requests reach the new copy from here on
        self.states.set(name, "READY")
        keep = self.catalog.keep_alive_for(config, keep_alive)
        memory.track(entry, keep, needed, rss_before, time.monotonic() - started)
        if old is not None:
            log.info(
                "model '%s' reloaded; the previous copy stops once its %d request(s) in flight finish",
                name,
                old.in_flight,
            )
            self.retiring.retire(old, entry)
        else:
            await memory.settle(name)
        return entry

    def _failed(self, name: str, old: LoadedModel | None, step: str, exc: BaseException) -> SwitchyardError:
        """Log a failed load, record its reason in the folder's state, and return the error for the caller: 400
        for a config error, 500 otherwise."""
        if isinstance(exc, ConfigError):
            log.error("model '%s' failed to %s: %s", name, step, exc)
        else:
            log.error("model '%s' failed to %s", name, step, exc_info=exc)
        reason = self.states.failed(name, old is not None, exc)
        self.residency.memory.load_failed(name)
        error = InvalidRequestError if isinstance(exc, ConfigError) else InternalError
        return error(f"failed to {step} '{name}': {reason}")

    def unload_locked(self, name: str, reason: str) -> asyncio.Task[None] | None:
        """Unload a folder for the residency manager (which holds the lock): an eviction."""
        return self._unload_folder(name, reason)

    def _unload_folder(self, name: str, reason: str) -> asyncio.Task[None] | None:
        """Take a model out of service now; its copy stops in the background once its requests finish."""
        entry = self.models.in_folder(name)
        if entry is None:
            if self.states.get(name).state != "UNLOADING":
                self.states.set(name, "UNAVAILABLE", "unloaded")
            return None
        self.models.withdraw(entry)
        self.residency.memory.forget(name, reason)
        self.states.set(name, "UNLOADING")
        log.info("unloading model '%s' (%d request(s) in flight)", name, entry.in_flight)
        return self.retiring.retire(entry, None)

    def _retired(self, entry: LoadedModel, successor: LoadedModel | None) -> None:
        """An unloaded copy has stopped: its folder is UNAVAILABLE (unless it was loaded again meanwhile)."""
        if successor is None and self.states.get(entry.folder).state == "UNLOADING":
            self.states.set(entry.folder, "UNAVAILABLE", "unloaded")

    # ------------------------------------------------------------------ polling (poll mode)

    def fingerprints(self) -> dict[str, str]:
        """Folder name -> fingerprint of its files when its last load (or load attempt) began."""
        return dict(self._fingerprints)

    async def apply_changes(self, changed: Mapping[str, str], removed: Iterable[str]) -> None:
        """The watcher's findings: unload removed folders, (re)load changed ones (ensembles last). Failures are
        logged and shown by the repository index; a model whose reload fails keeps serving its old copy."""
        async with self.lock():
            for name in removed:
                self._fingerprints.pop(name, None)
                self._unload_folder(name, "poll")
            self.catalog.refresh()
            for name in sorted(changed, key=self.catalog.is_ensemble):
                if self.models.in_folder(name) is None and self.catalog.loads_on_request(name):
                    self._fingerprints[name] = changed[name]  # loads on its first request
                    continue
                try:
                    self.catalog.find(name)
                except (InvalidRequestError, NotFoundError) as exc:
                    self._fingerprints[name] = changed[name]
                    if is_valid_model_name(name):
                        self._failed(name, self.models.in_folder(name), "load", ConfigError(exc.message))
                    else:
                        log.error("model repository: ignoring folder '%s': %s", name[:80], exc.message)
                    continue
                try:
                    await self._load_folder(name, fingerprint=changed[name])
                except (InvalidRequestError, NotFoundError, InternalError):
                    pass  # logged by _failed; the index says why

    def start_polling(self, interval_s: float) -> None:
        """Poll mode: rescan the repository every `interval_s` seconds (call on the event loop, after startup)."""
        from gateway.repository.watcher import RepositoryWatcher

        self._watcher = RepositoryWatcher(self, interval_s)
        self._watcher.start()

    async def close(self) -> None:
        """Stop polling and expiring, and let replaced or unloaded copies finish (shutdown; the loaded models stop
        separately)."""
        if self._watcher is not None:
            await self._watcher.stop()
            self._watcher = None
        await self.residency.stop()
        await self.retiring.close()
