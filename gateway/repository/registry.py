"""Loaded models by served name, and the control of what is loaded (each model is built by `builder.py`).

Two kinds of model share one registry: LLMs (an engine behind an `LLMScheduler`, for /v1 and v2 generate) and
tensor models (backend instances behind a batcher, for v2 infer and /v1/embeddings). `LoadedModel` describes
either uniformly. Which models load, and when, follows Triton's model control modes (`--model-control-mode`):

* `none`: every model loads at startup; the repository API's load/unload is refused.
* `explicit`: only `--load-model` models load at startup (`*` = all); the repository API loads and unloads.
* `poll`: every model loads at startup, then `watcher.RepositoryWatcher` applies the repository's changes;
  the repository API's load/unload is refused.

A reload builds and starts the new copy while the old one serves, swaps them, and stops the old copy only once
its in-flight requests have finished (see `serving.py`); a failed reload leaves the old copy serving and the
repository index says why. Names that arrive over the network are checked before the file system is touched
(see `layout.find_model_dir`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from gateway.errors import (
    ConfigError,
    InternalError,
    InvalidRequestError,
    ModelNotFoundError,
    NotFoundError,
    ServiceUnavailableError,
)
from gateway.heap import collect_retired
from gateway.repository.builder import build_model
from gateway.repository.layout import (
    ModelDir,
    find_model_dir,
    folder_fingerprint,
    is_valid_model_name,
    resolve_source,
    scan_repository,
)
from gateway.repository.loaded_model import LoadedModel
from gateway.repository.model_config import AnyModelConfig, ModelConfig, parse_model_config, validate_model_config
from gateway.repository.tensor_config import TensorModelConfig

log = logging.getLogger("switchyard.repository")

ControlMode = Literal["none", "explicit", "poll"]
#: Triton's words when the repository API is off (its tools and scripts look for them).
CONTROL_DISABLED = "explicit model load / unload is not allowed if polling is enabled"
DRAIN_TIMEOUT_S = 30.0


class ModelControlDisabledError(ServiceUnavailableError):
    """Load/unload through the repository API in the `none` or `poll` mode: 503 (UNAVAILABLE), as Triton."""

    code = "model_control_disabled"


class ModelRegistry:
    def __init__(
        self,
        root: Path,
        cache_dir: Path | None = None,
        *,
        control_mode: ControlMode = "none",
        load_models: Iterable[str] = (),
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
        rate_limiter: Any = None,
    ) -> None:
        self.root = root
        self.rate_limiter = rate_limiter  # gateway.scheduler.tensor.rate_limiter.RateLimiter (--rate-limit), or None
        self.cache_dir = cache_dir
        self.control_mode = control_mode
        self.load_models = list(load_models)  # explicit mode: loaded at startup; ["*"] = all
        self.drain_timeout_s = drain_timeout_s  # how long a replaced or unloaded copy may finish its requests
        self._models: dict[str, LoadedModel] = {}
        self._parsed: list[tuple[ModelDir, AnyModelConfig]] | None = None
        self._states: dict[str, tuple[str, str]] = {}  # folder name -> (state, reason)
        self._fingerprints: dict[str, str] = {}  # folder name -> its files when its last load began (polling)
        self._retiring: set[asyncio.Task[None]] = set()  # old copies finishing their requests
        self._watcher: Any = None  # watcher.RepositoryWatcher in poll mode
        self._lock: asyncio.Lock | None = None

    # ------------------------------------------------------------------ startup

    def _startup_models(self) -> list[ModelDir]:
        """The model folders to load at startup, as the control mode says."""
        if not self.root.is_dir():
            raise ConfigError(f"model repository '{self.root}' is not a directory; pass --model-repository DIR.")
        if self.control_mode == "explicit" and self.load_models != ["*"]:
            found = []
            for name in self.load_models:
                try:
                    model = find_model_dir(self.root, name)
                except ValueError as exc:
                    raise ConfigError(f"--load-model: {exc}.") from None
                if model is None:
                    raise ConfigError(f"--load-model {name}: the repository '{self.root}' has no model folder '{name}' "
                                      "with a config file; model names are folder names.")
                found.append(model)
            return found
        found = scan_repository(self.root)
        if not found and self.control_mode == "none":
            raise ConfigError(f"model repository '{self.root}' holds no model (no <model>/config.yaml found); add one, "
                              "or start with --model-control-mode=poll or explicit to add models later.")
        if not found:
            log.warning("model repository '%s' holds no model yet", self.root)
        return found

    def prepare(self) -> None:
        """Parse and check the startup models' configs without loading weights, so config errors surface before
        serving. In explicit mode without --load-model nothing loads at startup."""
        parsed = []
        for model in self._startup_models():
            self._fingerprints[model.name] = folder_fingerprint(model.path)
            config = parse_model_config(model.config_path, model.name)
            if (isinstance(config, ModelConfig) and config.backend == "pytorch") or (
                isinstance(config, TensorModelConfig) and config.model.source
            ):
                resolve_source(model, config.model.source, "model.source")
            parsed.append((model, config))
        self._parsed = parsed

    def _build(self, model: ModelDir, config: AnyModelConfig) -> LoadedModel:
        """Load one model (blocking)."""
        return build_model(model, config, self.cache_dir, self)

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
        for model, config in ordered:
            entry = self._build(model, config)
            self._models[entry.name] = entry
            self._states[model.name] = ("READY", "")
            loaded.append(entry)
        return loaded

    # ------------------------------------------------------------------ lookups

    def get(self, name: str) -> LoadedModel:
        try:
            return self._models[name]
        except KeyError:
            raise ModelNotFoundError(name) from None

    def llm(self, name: str) -> LoadedModel:
        """A model that generates text; 400 for a model of another kind (e.g. an embedding model)."""
        model = self.get(name)
        if model.scheduler is None:
            raise InvalidRequestError(
                f"The model '{name}' does not generate text (it serves /v1/embeddings or /v2 infer).", param="model"
            )
        return model

    def models(self) -> list[LoadedModel]:
        """The LLMs (models with a `scheduler`): what chat, completions, sessions and LLM metrics iterate."""
        return [m for m in self._models.values() if m.scheduler is not None]

    def all_models(self) -> list[LoadedModel]:
        """Every loaded model, LLMs and tensor models."""
        return list(self._models.values())

    def _loaded_folder(self, folder: str) -> LoadedModel | None:
        return next((m for m in self._models.values() if m.folder == folder), None)

    # ------------------------------------------------------------------ repository API (event loop)

    def _locked(self) -> asyncio.Lock:
        self._lock = self._lock or asyncio.Lock()
        return self._lock

    def _check_control(self) -> None:
        if self.control_mode == "explicit":
            return
        how = ("the repository is polled: add, change or remove model folders instead" if self.control_mode == "poll"
               else "start the server with --model-control-mode=explicit to load and unload models through this API")
        raise ModelControlDisabledError(f"{CONTROL_DISABLED} (model control mode is '{self.control_mode}'; {how})")

    def _find(self, name: str) -> ModelDir:
        try:
            model = find_model_dir(self.root, name)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        except ConfigError as exc:
            raise InvalidRequestError(self._public(str(exc))) from None
        if model is None:
            raise NotFoundError(f"no model named '{name}' in the model repository")
        return model

    def _public(self, message: str) -> str:
        """A load error for the network: paths shown relative to the repository."""
        for prefix in (str(self.root.resolve()), str(self.root)):
            message = message.replace(prefix + "/", "").replace(prefix, ".")
        return message[:1000]

    async def load(self, name: str, config_override: dict[str, Any] | None = None) -> LoadedModel:
        """Load (or reload) a model by folder name (explicit mode). In-flight requests finish on the old copy."""
        self._check_control()
        async with self._locked():
            return await self._load_folder(name, config_override)

    async def unload(self, name: str) -> None:
        """Unload a model by folder name (explicit mode); returns once its in-flight requests have finished."""
        self._check_control()
        async with self._locked():
            self._find(name)
            task = self._unload_folder(name)
        if task is not None:
            await asyncio.shield(task)  # the unload completes even if the caller goes away

    async def _load_folder(self, name: str, config_override: dict[str, Any] | None = None,
                           fingerprint: str | None = None) -> LoadedModel:
        """Build and start a new copy while the old one (if any) serves, then swap them (call under the lock)."""
        model = self._find(name)
        self._fingerprints[name] = fingerprint or await asyncio.to_thread(folder_fingerprint, model.path)
        old = self._loaded_folder(name)
        try:
            config = parse_model_config(model.config_path, name)
            if config_override is not None:
                if "model" in config_override:
                    raise ConfigError("a load request's config may not set 'model' (weights location); edit the file")
                weights = config.model
                on_disk = config.parameters.get("allow_pickle") if isinstance(config, TensorModelConfig) else None
                config = validate_model_config(config_override, f"{name}: load request config", name,
                                               tensor=model.config_path.suffix == ".pbtxt")
                if isinstance(config, TensorModelConfig) and config.parameters.get("allow_pickle") != on_disk:
                    raise ConfigError("a load request's config may not change parameter 'allow_pickle' (loading a "
                                      "pickle runs code): set it in the model's config file")
                config = config.model_copy(update={"model": weights}) if type(weights) is type(config.model) else config
            served = (config.served_model_name if isinstance(config, ModelConfig) else None) or name
            other = self._models.get(served)
            if other is not None and other.folder != name:
                raise ConfigError(f"{model.config_path}: the served name '{served}' is taken by the model folder "
                                  f"'{other.folder}'; choose another served_model_name.")
            if old is None:
                self._states[name] = ("LOADING", "")
            entry = await asyncio.to_thread(self._build, model, config)
        except ConfigError as exc:
            reason = self._public(str(exc))
            self._failed(name, old, reason)
            raise InvalidRequestError(f"failed to load '{name}': {reason}") from None
        except Exception:
            log.exception("model '%s' failed to load", name)
            self._failed(name, old, "failed to load; see the server log")
            raise InternalError(f"failed to load '{name}'; see the server log") from None
        try:
            await entry.start()
        except Exception:
            log.exception("model '%s' failed to start", name)
            await self._stop_quietly(entry)
            self._failed(name, old, "failed to start; see the server log")
            raise InternalError(f"failed to start '{name}'; see the server log") from None
        if old is not None and old.name != entry.name:
            self._models.pop(old.name, None)
        self._models[entry.name] = entry  # the swap: new requests reach the new copy from here on
        self._states[name] = ("READY", "")
        if old is not None:
            log.info("model '%s' reloaded; the previous copy stops once its %d request(s) in flight finish",
                     name, old.in_flight)
            self._retire(old, entry)
        return entry

    def _failed(self, name: str, old: LoadedModel | None, reason: str) -> None:
        """Record a failed load: a loaded copy keeps serving (READY, with the reason), otherwise UNAVAILABLE."""
        if old is not None:
            self._states[name] = ("READY", f"reload failed, serving the previous copy: {reason}")
            log.error("model '%s': reload failed, the previous copy keeps serving: %s", name, reason)
        else:
            self._states[name] = ("UNAVAILABLE", reason)
            log.error("model '%s' failed to load: %s", name, reason)

    def _unload_folder(self, name: str) -> asyncio.Task[None] | None:
        """Take a model out of service now; its copy stops in the background once its requests finish."""
        entry = self._loaded_folder(name)
        if entry is None:
            if self._states.get(name, ("", ""))[0] != "UNLOADING":
                self._states[name] = ("UNAVAILABLE", "unloaded")
            return None
        del self._models[entry.name]
        self._states[name] = ("UNLOADING", "")
        log.info("unloading model '%s' (%d request(s) in flight)", name, entry.in_flight)
        return self._retire(entry, None, folder=name)

    def _retire(self, old: LoadedModel, successor: LoadedModel | None, folder: str | None = None) -> asyncio.Task[None]:
        task = asyncio.create_task(self._drain_and_stop(old, successor, folder), name=f"retire-{old.name}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        return task

    async def _drain_and_stop(self, old: LoadedModel, successor: LoadedModel | None, folder: str | None) -> None:
        old.retire(successor)
        try:
            if old.in_flight:
                await asyncio.wait_for(old.wait_idle(), self.drain_timeout_s)
        except TimeoutError:
            log.warning("model '%s': %d request(s) still running after %gs of draining; stopping them",
                        old.name, old.in_flight, self.drain_timeout_s)
        finally:
            await self._stop_quietly(old)
            collect_retired()
            if folder is not None and self._states.get(folder, ("", ""))[0] == "UNLOADING":
                self._states[folder] = ("UNAVAILABLE", "unloaded")

    @staticmethod
    async def _stop_quietly(entry: LoadedModel) -> None:
        try:
            await entry.stop()
        except Exception:
            log.exception("model '%s' did not stop cleanly", entry.name)

    # ------------------------------------------------------------------ polling (poll mode)

    def fingerprints(self) -> dict[str, str]:
        """Folder name -> fingerprint of its files when its last load (or load attempt) began."""
        return dict(self._fingerprints)

    def _is_ensemble(self, name: str) -> bool:
        try:
            model = find_model_dir(self.root, name)
            config = parse_model_config(model.config_path, name) if model is not None else None
        except (ConfigError, ValueError, OSError):
            return False
        return isinstance(config, TensorModelConfig) and config.resolved_backend == "ensemble"

    async def apply_changes(self, changed: Mapping[str, str], removed: Iterable[str]) -> None:
        """The watcher's findings: unload removed folders, (re)load changed ones (ensembles last). Failures are
        logged and shown by the repository index; a model whose reload fails keeps serving its old copy."""
        async with self._locked():
            for name in removed:
                self._fingerprints.pop(name, None)
                self._unload_folder(name)
            for name in sorted(changed, key=self._is_ensemble):
                try:
                    self._find(name)
                except (InvalidRequestError, NotFoundError) as exc:
                    self._fingerprints[name] = changed[name]
                    if is_valid_model_name(name):
                        self._failed(name, self._loaded_folder(name), exc.message)
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
        """Stop polling and let replaced or unloaded copies finish (shutdown; the loaded models stop separately)."""
        if self._watcher is not None:
            await self._watcher.stop()
            self._watcher = None
        if self._retiring:
            await asyncio.wait(set(self._retiring), timeout=self.drain_timeout_s)
            for task in list(self._retiring):
                task.cancel()
            await asyncio.gather(*self._retiring, return_exceptions=True)

    # ------------------------------------------------------------------ index

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every model folder with its state (a never-loaded model: its name only)."""
        rows: list[dict[str, str]] = []
        try:
            names = sorted({p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")})
        except OSError:
            names = []
        for name in names:
            try:
                model = find_model_dir(self.root, name)
            except (ValueError, ConfigError):
                continue
            if model is None:
                continue
            state, reason = self._states.get(name, ("", ""))
            entry = self._loaded_folder(name)
            if entry is not None:
                for version in entry.versions:
                    rows.append({"name": name, "version": str(version), "state": "READY",
                                 "reason": reason if state == "READY" else ""})
            elif ready_only:
                continue
            elif state:
                rows.append({"name": name, "version": "", "state": state, "reason": reason})
            else:
                rows.append({"name": name})
        return rows
