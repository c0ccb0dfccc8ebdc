"""Loaded models by served name: builds each model's engine and scheduler from its config.

Two kinds of model share one registry: LLMs (an engine behind an `LLMScheduler`, for /v1 and v2 generate) and
tensor models (backend instances behind a batcher, for v2 infer and /v1/embeddings). `LoadedModel` describes
either uniformly. Models load at startup and, through the v2 repository API, on request: names that arrive
over the network are checked before the file system is touched (see `layout.find_model_dir`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.errors import ConfigError, InternalError, InvalidRequestError, ModelNotFoundError, NotFoundError
from gateway.repository.layout import ModelDir, find_model_dir, resolve_source, scan_repository
from gateway.repository.model_config import AnyModelConfig, ModelConfig, parse_model_config, validate_model_config
from gateway.repository.tensor_config import TensorModelConfig
from gateway.scheduler.llm_scheduler import LLMScheduler

log = logging.getLogger("switchyard.repository")


@dataclass
class LoadedModel:
    """A served model. `scheduler` is set for LLMs, `tensor` for tensor models (see `kind`)."""

    name: str
    config: AnyModelConfig
    scheduler: LLMScheduler | None = None
    tensor: Any = None  # gateway.kserve.model.TensorModel
    folder: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def kind(self) -> str:
        return "llm" if self.scheduler is not None else "tensor"

    @property
    def max_model_len(self) -> int | None:
        """Context length in tokens (LLMs, text encoders); None for models without one."""
        if self.scheduler is not None:
            return self.scheduler.info.max_model_len
        return self.tensor.describe().get("max_model_len") if self.tensor is not None else None

    @property
    def versions(self) -> list[int]:
        return sorted(self.tensor.versions) if self.tensor is not None else [1]

    async def start(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.start()
        if self.tensor is not None:
            await self.tensor.start()

    async def stop(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.stop()
        if self.tensor is not None:
            await self.tensor.stop()


def build_scheduler(model: ModelDir, config: ModelConfig, cache_dir: Path | None) -> LLMScheduler:
    """Construct the engine named by `config.backend` (blocking: loads weights)."""
    if config.backend != "pytorch":  # engines that batch internally: vllm, tensorrt_llm, remote
        from gateway.repository.async_engines import build_async_scheduler

        return build_async_scheduler(model, config, cache_dir)
    from engines.pytorch.engine import PyTorchEngine
    from gateway.scheduler.sequence_batcher import BatcherLimits, SequenceBatcher

    source = resolve_source(model, config.model.source, "model.source")
    engine = PyTorchEngine(
        source,
        gguf_file=config.model.gguf_file,
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        block_size=config.kv_cache.block_size,
        kv_cache_tokens=config.kv_cache.max_tokens,
        cache_dir=cache_dir,
    )
    limits = BatcherLimits(
        max_num_seqs=config.scheduler.max_num_seqs,
        max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
        max_queue_size=config.scheduler.max_queue_size,
    )
    return SequenceBatcher(engine, limits)


class ModelRegistry:
    def __init__(self, root: Path, cache_dir: Path | None = None) -> None:
        self.root = root
        self.cache_dir = cache_dir
        self._models: dict[str, LoadedModel] = {}
        self._parsed: list[tuple[ModelDir, AnyModelConfig]] | None = None
        self._states: dict[str, tuple[str, str]] = {}  # folder name -> (state, reason)
        self._lock: asyncio.Lock | None = None

    # ------------------------------------------------------------------ startup

    def prepare(self) -> None:
        """Parse and check every config without loading weights, so config errors surface before serving."""
        found = scan_repository(self.root)
        if not found:
            raise ConfigError(f"model repository '{self.root}' holds no model (no <model>/config.yaml found).")
        parsed = [(m, parse_model_config(m.config_path, m.name)) for m in found]
        for model, config in parsed:
            if isinstance(config, ModelConfig) and config.backend == "pytorch":
                resolve_source(model, config.model.source, "model.source")
            elif isinstance(config, TensorModelConfig) and config.model.source:
                resolve_source(model, config.model.source, "model.source")
        self._parsed = parsed

    def _build(self, model: ModelDir, config: AnyModelConfig) -> LoadedModel:
        """Load one model (blocking)."""
        started = time.monotonic()
        if isinstance(config, TensorModelConfig):
            from gateway.kserve.model import TensorModel
            from gateway.kserve.schedulers import scheduler_factory

            log.info("loading model '%s' (backend %s)", model.name, config.resolved_backend)
            tensor = TensorModel(model, config)
            tensor.load(scheduler_factory(self))
            entry = LoadedModel(model.name, config, tensor=tensor, folder=model.name)
            log.info("model '%s' ready in %.1fs: backend %s, versions %s, %d instance(s), max_batch_size %d",
                     model.name, time.monotonic() - started, tensor.backend, sorted(tensor.versions),
                     config.instance_count, config.max_batch_size)
            return entry
        log.info("loading model '%s' (backend %s, dtype %s)", model.name, config.backend, config.dtype)
        scheduler = build_scheduler(model, config, self.cache_dir)
        name = config.served_model_name or model.name
        info = scheduler.info
        log.info(
            "model '%s' ready in %.1fs: engine %s, %s, dtype %s, context %d tokens, KV cache %d blocks x %d "
            "tokens (%.0f MiB)",
            name, time.monotonic() - started, config.backend, info.model_type, info.dtype, info.max_model_len,
            info.num_kv_blocks, info.block_size,
            info.num_kv_blocks * info.block_size * info.kv_bytes_per_token / 2**20,
        )
        return LoadedModel(name, config, scheduler=scheduler, folder=model.name)

    def load_all(self) -> list[LoadedModel]:
        """Load each model's weights and build its scheduler (blocking; call off the event loop).

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

    # ------------------------------------------------------------------ repository API (event loop)

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
        """Load (or reload) a model by folder name. In-flight requests finish on the old copy."""
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            model = self._find(name)
            try:
                config = parse_model_config(model.config_path, name)
                if config_override is not None:
                    if "model" in config_override:
                        raise ConfigError("a load request's config may not set 'model' (weights location); edit the file")
                    weights = config.model
                    config = validate_model_config(config_override, f"{name}: load request config", name,
                                                   tensor=model.config_path.suffix == ".pbtxt")
                    config = config.model_copy(update={"model": weights}) if type(weights) is type(config.model) else config
                self._states[name] = ("LOADING", "")
                entry = await asyncio.to_thread(self._build, model, config)
            except ConfigError as exc:
                reason = self._public(str(exc))
                self._states[name] = ("UNAVAILABLE", reason)
                raise InvalidRequestError(f"failed to load '{name}': {reason}") from None
            except Exception:
                log.exception("model '%s' failed to load", name)
                self._states[name] = ("UNAVAILABLE", "failed to load; see the server log")
                raise InternalError(f"failed to load '{name}'; see the server log") from None
            await entry.start()
            old = self._models.get(entry.name)
            self._models[entry.name] = entry
            self._states[name] = ("READY", "")
            if old is not None:
                await old.stop()
            return entry

    async def unload(self, name: str) -> None:
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            self._find(name)
            entry = next((m for m in self._models.values() if m.folder == name), None)
            self._states[name] = ("UNAVAILABLE", "unloaded")
            if entry is None:
                return
            del self._models[entry.name]
            await entry.stop()

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every model folder with its state."""
        rows = []
        names = sorted({p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")})
        for name in names:
            try:
                model = find_model_dir(self.root, name)
            except (ValueError, ConfigError):
                continue
            if model is None:
                continue
            state, reason = self._states.get(name, ("UNAVAILABLE", "unloaded"))
            entry = next((m for m in self._models.values() if m.folder == name), None)
            if entry is not None and state == "READY":
                for version in entry.versions:
                    rows.append({"name": name, "version": str(version), "state": "READY", "reason": ""})
            elif not ready_only:
                rows.append({"name": name, "version": "", "state": state, "reason": reason})
        return rows
