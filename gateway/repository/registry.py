"""Loaded models by served name: builds each model's engine and scheduler from its config."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from gateway.errors import ConfigError, ModelNotFoundError
from gateway.repository.layout import ModelDir, resolve_source, scan_repository
from gateway.repository.model_config import ModelConfig, parse_model_config
from gateway.scheduler.llm_scheduler import LLMScheduler

log = logging.getLogger("switchyard.repository")


@dataclass
class LoadedModel:
    name: str
    config: ModelConfig
    scheduler: LLMScheduler
    created: int = field(default_factory=lambda: int(time.time()))


def build_scheduler(model: ModelDir, config: ModelConfig, cache_dir: Path | None) -> LLMScheduler:
    """Construct the engine named by `config.backend` (blocking: loads weights)."""
    if config.backend != "pytorch":
        raise ConfigError(
            f"{model.config_path}: field 'backend': '{config.backend}' is not available in this build yet; "
            "use 'pytorch'."
        )
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
        self._parsed: list[tuple[ModelDir, ModelConfig]] | None = None

    def prepare(self) -> None:
        """Parse and check every config without loading weights, so config errors surface before serving."""
        found = scan_repository(self.root)
        if not found:
            raise ConfigError(f"model repository '{self.root}' holds no model (no <model>/config.yaml found).")
        parsed = [(m, parse_model_config(m.config_path, m.name)) for m in found]
        for model, config in parsed:
            if config.backend == "pytorch":
                resolve_source(model, config.model.source, "model.source")
        self._parsed = parsed

    def load_all(self) -> list[LoadedModel]:
        """Load each model's weights and build its scheduler (blocking; call off the event loop)."""
        if self._parsed is None:
            self.prepare()
        assert self._parsed is not None
        loaded = []
        for model, config in self._parsed:
            started = time.monotonic()
            log.info("loading model '%s' (backend %s, dtype %s)", model.name, config.backend, config.dtype)
            scheduler = build_scheduler(model, config, self.cache_dir)
            name = config.served_model_name or model.name
            entry = LoadedModel(name, config, scheduler)
            self._models[name] = entry
            loaded.append(entry)
            info = scheduler.info
            log.info(
                "model '%s' ready in %.1fs: engine %s, %s, dtype %s, context %d tokens, KV cache %d blocks x %d "
                "tokens (%.0f MiB)",
                name, time.monotonic() - started, config.backend, info.model_type, info.dtype, info.max_model_len,
                info.num_kv_blocks, info.block_size,
                info.num_kv_blocks * info.block_size * info.kv_bytes_per_token / 2**20,
            )
        return loaded

    def get(self, name: str) -> LoadedModel:
        try:
            return self._models[name]
        except KeyError:
            raise ModelNotFoundError(name) from None

    def models(self) -> list[LoadedModel]:
        return list(self._models.values())
