"""How much memory the models may take (`--memory-budget`), and how much one model takes, before and after loading.

The budget bounds the whole server's resident memory (its RSS), models and all: what the process holds besides the
models (Python, torch, the frontends) counts too, so a budget set to a container's limit keeps the process under it.
Without `--memory-budget` it is the tightest of the process's cgroup memory limit (v2 `memory.max`, v1
`memory.limit_in_bytes`, over its cgroup and every cgroup above it) and the machine's memory.

Before a model loads its resident bytes are estimated from its files and config (`estimate_bytes`): the weights'
file sizes, scaled where the engine converts them to a wider dtype, plus the KV cache pool it will allocate (whole:
the pool is faulted in as requests use it, so it becomes resident under load). After loading, the engine's own
count (weights held + KV pool, `EngineInfo.weight_bytes`) replaces the estimate where the engine gives one.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from engines.cpu_budget import CGROUP_ROOT, PROC_CGROUP
from gateway.repository.layout import ModelDir, resolve_source
from gateway.repository.loaded_model import LoadedLLM, LoadedModel
from gateway.repository.model_config import AnyModelConfig, ModelConfig

log = logging.getLogger("switchyard.repository")

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".onnx", ".tl", ".json", ".model", ".txt")
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8}
NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a number near 2**63


@dataclass(frozen=True)
class MemoryLimit:
    """A memory limit in bytes, and what set it (for the log and the errors)."""

    bytes: int
    source: str


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cgroup_dirs(mount: Path, cgroup_path: str) -> list[Path]:
    """The cgroup's directory and each one above it, up to the mount."""
    parts = [p for p in cgroup_path.split("/") if p]
    dirs = [mount.joinpath(*parts[:i]) for i in range(len(parts), 0, -1)]
    return [d for d in dirs if d.is_dir()] + [mount]


def cgroup_memory_limit(proc_cgroup: Path = PROC_CGROUP, cgroup_root: Path = CGROUP_ROOT) -> MemoryLimit | None:
    """The tightest memory limit over this process's cgroup and its ancestors (v2 and v1), or None."""
    text = _read(proc_cgroup)
    if text is None:
        return None
    limits: list[MemoryLimit] = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # v2 (unified)
            mounts, file = (cgroup_root, cgroup_root / "unified"), "memory.max"
        elif "memory" in controllers.split(","):  # v1
            mounts, file = (cgroup_root / controllers, cgroup_root / "memory"), "memory.limit_in_bytes"
        else:
            continue
        for mount in mounts:
            if not mount.is_dir():
                continue
            for directory in _cgroup_dirs(mount, path):
                value = _read(directory / file)
                if value and value.isdigit() and 0 < int(value) < NO_LIMIT:
                    limits.append(MemoryLimit(int(value), f"cgroup limit {directory / file}"))
            break
    return min(limits, key=lambda limit: limit.bytes, default=None)


def machine_memory() -> MemoryLimit:
    return MemoryLimit(psutil.virtual_memory().total, "the machine's memory")


def default_budget(proc_cgroup: Path = PROC_CGROUP, cgroup_root: Path = CGROUP_ROOT) -> MemoryLimit:
    """The budget without --memory-budget: the cgroup's limit where it is below the machine's memory."""
    machine = machine_memory()
    cgroup = cgroup_memory_limit(proc_cgroup, cgroup_root)
    return cgroup if cgroup is not None and cgroup.bytes < machine.bytes else machine


def process_rss() -> int:
    """This process's resident memory, in bytes."""
    return psutil.Process(os.getpid()).memory_info().rss


def fmt_bytes(n: float) -> str:
    """1.5 GiB, 300 MiB, 12 KiB: for errors and logs."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


# ---------------------------------------------------------------- estimates


def _files_bytes(path: Path, limit: int = 10_000) -> int:
    """Bytes of the weight-like files at `path` (a file, or a folder searched recursively)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for i, child in enumerate(path.rglob("*")):
        if i >= limit:
            break
        if child.is_file() and child.suffix in WEIGHT_SUFFIXES:
            total += child.stat().st_size
    return total


def _hf_config(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    return 2 * layers * kv_heads * head_dim * dtype_bytes


@dataclass(frozen=True)
class LLMBytes:
    """A native-engine LLM's bytes, from its files and config: what it holds once loaded (weights, KV pool), and what
    its load reads besides (load_peak.py): the weight files as stored, and every tensor in float32 where the loader
    dequantizes the whole file at once (0 where it does not)."""

    weights: int
    kv_pool: int
    files: int
    float32: int


def _gguf_estimate(path: Path, config: ModelConfig) -> tuple[int, int, int]:
    """(weights, KV bytes per token, float32 bytes of a dequantizing load) of a GGUF file as the native engine will
    hold it."""
    from engines.pytorch.gguf_file import read_layout

    layout = read_layout(path)
    as_blocks = config.dtype == "float32" and config.pytorch.fast_kernels
    float32 = 0
    if as_blocks:
        weights = path.stat().st_size  # served from the file's own blocks
    else:
        numel = sum(int(_product(t.shape)) for t in layout.tensors.values())
        weights = numel * DTYPE_BYTES[config.dtype]
        float32 = numel * DTYPE_BYTES["float32"]  # transformers' GGUF loader dequantizes to float32, then casts
    heads = int(layout.field("attention.head_count", 0) or 0)
    kv_heads = int(layout.field("attention.head_count_kv", heads) or heads)
    head_dim = int(layout.field("attention.key_length", 0) or 0) or (
        int(layout.field("embedding_length", 0) or 0) // max(heads, 1)
    )
    per_token = _kv_bytes_per_token(
        int(layout.field("block_count", 0) or 0), kv_heads, head_dim, _kv_dtype_bytes(config)
    )
    return weights, per_token, float32


def _product(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _kv_dtype_bytes(config: ModelConfig) -> int:
    return 2 if config.kv_cache.dtype == "bfloat16" else DTYPE_BYTES[config.dtype]


def llm_bytes(source: Path, config: ModelConfig) -> LLMBytes:
    """A native-engine LLM's bytes (blocking: reads file sizes and a GGUF header)."""
    gguf = source / config.model.gguf_file if config.model.gguf_file else source
    if gguf.is_file() and gguf.suffix == ".gguf":
        weights, per_token, float32 = _gguf_estimate(gguf, config)
        files = gguf.stat().st_size
    else:
        folder = source if source.is_dir() else source.parent
        hf = _hf_config(folder)
        file_dtype = str(hf.get("torch_dtype") or hf.get("dtype") or config.dtype)
        scale = DTYPE_BYTES[config.dtype] / DTYPE_BYTES.get(file_dtype, DTYPE_BYTES[config.dtype])
        files = sum(p.stat().st_size for p in folder.glob("*.safetensors")) or sum(
            p.stat().st_size for p in folder.glob("*.bin")
        )
        weights, float32 = int(files * scale), 0
        heads = int(hf.get("num_attention_heads", 0) or 0)
        head_dim = int(hf.get("head_dim", 0) or 0) or int(hf.get("hidden_size", 0) or 0) // max(heads, 1)
        per_token = _kv_bytes_per_token(
            int(hf.get("num_hidden_layers", 0) or 0),
            int(hf.get("num_key_value_heads", heads) or heads),
            head_dim,
            _kv_dtype_bytes(config),
        )
    return LLMBytes(weights, config.kv_cache.max_tokens * per_token, files, float32)


def estimate_bytes(model: ModelDir, config: AnyModelConfig) -> int:
    """The resident bytes `model` will take once loaded, from its files and config (blocking: reads file sizes and
    a GGUF header). Engines whose memory is elsewhere (remote upstreams, a vLLM or TensorRT-LLM process) count 0."""
    if isinstance(config, ModelConfig):
        if config.backend != "pytorch":
            return 0
        parts = llm_bytes(resolve_source(model, config.model.source, "model.source"), config)
        return parts.weights + parts.kv_pool
    if config.model.source:
        return _files_bytes(resolve_source(model, config.model.source, "model.source"))
    return sum(_files_bytes(model.path / str(v)) for v in model.versions)


def reported_bytes(entry: LoadedModel) -> int | None:
    """What a loaded LLM's engine says it holds (weights + the whole KV pool), or None where it does not say."""
    if not isinstance(entry, LoadedLLM):
        return None
    info = entry.scheduler.info
    if not info.weight_bytes:
        return None
    return int(info.weight_bytes + info.num_kv_blocks * info.block_size * info.kv_bytes_per_token)


def trim_heap() -> bool:
    """Hand the heap's free memory back to the OS once a model has stopped (glibc's malloc_trim; elsewhere a no-op
    that returns False), so the RSS the budget reads falls with the unload."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))
