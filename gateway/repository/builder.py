"""Build a model from its folder and config: an LLM's engine and scheduler, or a tensor model's backend instances.

`build_scheduler` picks the engine `backend` names (the native engine here, the engines that batch internally in
`async_engines.py`); `build_model` wraps the result as the `LoadedModel` the registry serves. Both block (they load
weights): the registry calls them off the event loop.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engines.interface import AdapterHost, StepEngine
from gateway.repository.adapter_catalog import LORA_BACKENDS, load_adapters
from gateway.repository.layout import ModelDir, resolve_source
from gateway.repository.loaded_model import LoadedLLM, LoadedModel, LoadedTensorModel
from gateway.repository.model_config import AnyModelConfig, ModelConfig
from gateway.repository.serving import ServingScheduler
from gateway.repository.tensor_config import TensorModelConfig
from gateway.scheduler.llm.interface import LLMScheduler

if TYPE_CHECKING:
    from gateway.repository.registry import ModelRegistry
    from gateway.scheduler.tensor.rate_limiter import RateLimiter

log = logging.getLogger("switchyard.repository")


def build_scheduler(model: ModelDir, config: ModelConfig, cache_dir: Path | None) -> LLMScheduler:
    """Construct the engine named by `config.backend` (blocking: loads weights)."""
    if config.backend != "pytorch":  # engines that batch internally: vllm, tensorrt_llm, remote, openai
        from gateway.repository.async_engines import build_async_scheduler

        return build_async_scheduler(model, config, cache_dir)
    from engines.interface import ModelFileError, UnsupportedModelError
    from engines.pytorch.engine import PyTorchEngine
    from gateway.errors import ConfigError
    from gateway.scheduler.llm.continuous_batcher import ContinuousBatcher

    source = resolve_source(model, config.model.source, "model.source")
    try:
        engine = PyTorchEngine(
            source,
            gguf_file=config.model.gguf_file,
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            block_size=config.kv_cache.block_size,
            kv_cache_tokens=config.kv_cache.max_tokens,
            kv_cache_dtype=config.kv_cache.dtype,
            cache_dir=cache_dir,
            fast_kernels=config.pytorch.fast_kernels,
            gemm_threads=config.pytorch.gemm_threads,
            match_transformers=config.pytorch.match_transformers,
            int8_activations=config.pytorch.int8_activations,
        )
    except (UnsupportedModelError, ModelFileError) as exc:  # the model's state on /v2/repository/index says why
        raise ConfigError(f"{model.config_path}: {exc}") from None
    return ContinuousBatcher(engine, config.scheduler, config.kv_cache, config.pytorch.speculative)


def build_model(
    model: ModelDir,
    config: AnyModelConfig,
    cache_dir: Path | None,
    models: ModelRegistry,
    rate_limiter: RateLimiter | None = None,
    lora_dirs: tuple[Path, ...] = (),
    cpu_threads: int | None = None,
) -> LoadedModel:
    """Load one model (blocking): an LLM's engine and scheduler (and its LoRA adapters), or a tensor model's backend
    instances behind their batcher (`models`: where an ensemble finds the models it calls; `rate_limiter`: the
    server's, or None; `lora_dirs`: folders adapters may be loaded from besides the model's; `cpu_threads`: a tensor
    model's share of the CPU budget, cpu_plan.py; an LLM's is its `pytorch.gemm_threads`)."""
    started = time.monotonic()
    if isinstance(config, TensorModelConfig):
        from gateway.tensor.model import TensorModel
        from gateway.tensor.schedulers import scheduler_factory

        log.info("loading model '%s' (backend %s)", model.name, config.resolved_backend)
        tensor = TensorModel(model, config, rate_limiter, cpu_threads)
        tensor.load(scheduler_factory(models.find_tensor))
        entry = LoadedTensorModel(
            name=model.name, config=config, tensor=tensor, folder=model.name, load_seconds=time.monotonic() - started
        )
        log.info(
            "model '%s' ready in %.1fs: backend %s, versions %s, %d instance(s), max_batch_size %d",
            model.name,
            time.monotonic() - started,
            tensor.backend,
            sorted(tensor.versions),
            config.instance_count,
            config.max_batch_size,
        )
        return entry
    log.info("loading model '%s' (backend %s, dtype %s)", model.name, config.backend, config.dtype)
    name = config.served_model_name or model.name
    scheduler = ServingScheduler(build_scheduler(model, config, cache_dir), name)
    info = scheduler.info
    log.info(
        "model '%s' ready in %.1fs: engine %s, %s, dtype %s, context %d tokens, KV cache %d blocks x %d "
        "tokens (%.0f MiB)",
        name,
        time.monotonic() - started,
        config.backend,
        info.model_type,
        info.dtype,
        info.max_model_len,
        info.num_kv_blocks,
        info.block_size,
        info.num_kv_blocks * info.block_size * info.kv_bytes_per_token / 2**20,
    )
    llm = LoadedLLM(
        name=name, config=config, scheduler=scheduler, folder=model.name, load_seconds=time.monotonic() - started
    )
    engine = llm.engine
    _ = llm.parsers  # the tool-call and reasoning parsers, chosen once (a misconfigured one fails the load)
    if scheduler.passthrough is None:  # probe the chat template here, off the event loop (an upstream renders its own)
        _ = llm.template_support
    if config.backend in LORA_BACKENDS and isinstance(engine, AdapterHost):
        try:
            llm.adapters = load_adapters(llm, model, engine, models, lora_dirs)
        except Exception:
            if isinstance(engine, StepEngine):  # not started yet: free its weights and threads now
                engine.shutdown()
            raise
    return llm
