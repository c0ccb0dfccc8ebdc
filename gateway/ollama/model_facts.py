"""What /api/tags, /api/show and /api/ps say of a model, loaded or not, read from its weights' files without loading
them.

* A GGUF file: its header (engines/pytorch/gguf_file.py): `model_info` is its metadata as Ollama shows it (arrays
  such as the vocabulary as `[]`, as Ollama does without `verbose`), the family its architecture, the parameter count
  the sum of its tensors' sizes, the quantization its `general.file_type` (Q4_1, Q8_0, ...).
* A Hugging Face folder: `config.json` (`model_type`, sizes, in the GGUF key names Ollama uses) and the safetensors
  headers (parameter count, dtype).
* Anything else (a vLLM model named by its Hub id, a remote upstream, an ONNX file): what the loaded model knows
  (for a model not loaded: its config file's time).

The chat template comes from the same files (the GGUF's `tokenizer.chat_template`, else the folder's
`chat_template.jinja` or `tokenizer_config.json`), so a model that is not loaded shows its template and whether it
reasons.

`size` is the weights' bytes on disk; `digest` a SHA-256 of the model folder's fingerprint and the weights' names,
sizes and modification times (not of their content: hashing gigabytes per listing would stall the server).
Facts are cached per model folder until its files change.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.errors import ConfigError
from gateway.repository.layout import find_model_dir, folder_fingerprint, resolve_source
from gateway.repository.loaded_model import LoadedLLM, LoadedModel
from gateway.repository.model_config import AnyModelConfig, ModelConfig

log = logging.getLogger("switchyard.ollama")

MAX_FILES = 10_000
# config.json keys -> the GGUF key (after "<architecture>.") Ollama's model_info uses
HF_KEYS = {
    "max_position_embeddings": "context_length",
    "hidden_size": "embedding_length",
    "num_hidden_layers": "block_count",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "intermediate_size": "feed_forward_length",
    "vocab_size": "vocab_size",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base",
}
DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


@dataclass(frozen=True)
class Facts:
    format: str = ""  # gguf, safetensors, onnx, ...
    family: str = ""
    parameter_count: int | None = None
    quantization: str = ""
    size: int = 0  # bytes of the weights on disk
    modified: float = 0.0  # the newest modification time of the config and the weights (Unix seconds)
    digest: str = ""
    source: str = ""  # where the weights are, as the config says
    info: dict[str, Any] = field(default_factory=dict)  # model_info
    chat_template: str = ""  # the files' chat template (GGUF metadata, tokenizer_config.json, chat_template.jinja)


def parameter_size(count: int | None) -> str:
    """Ollama's way of writing a parameter count: 135M, 1.5B, 8B."""
    if not count:
        return ""
    for scale, unit, digits in ((1e9, "B", 1), (1e6, "M", 2), (1e3, "K", 0)):
        if count >= scale:
            number = count / scale
            return f"{number:.0f}{unit}" if number == math.floor(number) else f"{number:.{digits}f}{unit}"
    return str(count)


def _weights(root: Path, name: str, config: AnyModelConfig) -> tuple[Path, Path, str] | None:
    """(config file, weights file or folder, the source as configured), or None when they are not local files."""
    folder = find_model_dir(root, name) if name else None
    if folder is None:
        return None
    source = config.model.source
    if isinstance(config, ModelConfig) and config.backend == "remote":
        return None
    path = resolve_source(folder, source, "model.source")
    gguf = config.model.gguf_file if isinstance(config, ModelConfig) else None
    if gguf:
        path = path / gguf
    return folder.config_path, path, source or str(path.relative_to(folder.path))


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    found = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    return found[:MAX_FILES]


def _gguf_facts(path: Path) -> dict[str, Any]:
    from gguf import LlamaFileType

    from engines.pytorch.gguf_file import read_layout

    layout = read_layout(path)
    count = sum(math.prod(t.shape) for t in layout.tensors.values())
    info: dict[str, Any] = {k: v for k, v in layout.fields.items() if isinstance(v, int | float | str | bool)}
    info |= {key: [] for key in layout.array_lengths}
    info["general.parameter_count"] = count
    file_type = layout.fields.get("general.file_type")
    try:
        quantization = LlamaFileType(file_type).name.removeprefix("MOSTLY_") if file_type is not None else ""
    except ValueError:
        quantization = ""
    return {
        "format": "gguf",
        "family": layout.architecture,
        "parameter_count": count,
        "quantization": quantization,
        "info": dict(sorted(info.items())),
        "chat_template": str(layout.fields.get("tokenizer.chat_template") or ""),
    }


def _hf_facts(files: list[Path]) -> dict[str, Any]:
    from safetensors import safe_open

    config_file = min((f for f in files if f.name == "config.json"), key=lambda f: len(f.parts), default=None)
    config = json.loads(config_file.read_text()) if config_file else {}
    arch = str(config.get("model_type", ""))
    by_dtype: dict[str, int] = {}  # values per safetensors dtype (F32, BF16, I64, ...)
    tensors = [f for f in files if f.suffix == ".safetensors"]
    for file in tensors:
        with safe_open(str(file), "np") as f:
            for key in f.keys():
                tensor = f.get_slice(key)
                dtype = tensor.get_dtype()
                by_dtype[dtype] = by_dtype.get(dtype, 0) + math.prod(tensor.get_shape())
    count = sum(by_dtype.values())
    info: dict[str, Any] = {"general.architecture": arch} if arch else {}
    info |= {f"{arch}.{key}": config[name] for name, key in HF_KEYS.items() if arch and name in config}
    if count:
        info["general.parameter_count"] = count
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "")
    quantization = DTYPES.get(dtype, dtype.upper()) if dtype else max(by_dtype, key=by_dtype.__getitem__, default="")
    return {
        "format": "safetensors" if tensors else "",
        "family": arch,
        "parameter_count": count or None,
        "quantization": quantization,
        "info": info,
        "chat_template": _hf_template(files),
    }


def _hf_template(files: list[Path]) -> str:
    """A Hugging Face folder's chat template: chat_template.jinja, else tokenizer_config.json's (named templates
    joined, as chat_template.template_text does)."""
    by_name = {f.name: f for f in sorted(files, key=lambda f: -len(f.parts))}  # the shallowest file of each name
    if "chat_template.jinja" in by_name:
        return by_name["chat_template.jinja"].read_text()
    if "tokenizer_config.json" not in by_name:
        return ""
    template = json.loads(by_name["tokenizer_config.json"].read_text()).get("chat_template")
    if isinstance(template, list):
        return "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return template if isinstance(template, str) else ""


def _format_of(files: list[Path]) -> str:
    suffixes = {f.suffix for f in files}
    for suffix, name in (
        (".gguf", "gguf"),
        (".safetensors", "safetensors"),
        (".onnx", "onnx"),
        (".pt", "pytorch"),
        (".bin", "pytorch"),
        (".savedmodel", "tensorflow"),
    ):
        if suffix in suffixes:
            return name
    return ""


@functools.lru_cache(maxsize=64)
def _read(config_file: Path, path: Path, source: str, stamp: tuple[Any, ...]) -> Facts:
    """The facts of one set of files (`stamp`: their names, sizes and times, the cache key)."""
    files = _files(path)
    read: dict[str, Any] = {}
    try:
        gguf = next((f for f in files if f.suffix == ".gguf"), None)
        read = _gguf_facts(gguf) if gguf is not None else _hf_facts(files)
    except Exception as exc:  # noqa: BLE001 - a file the engine reads differently: list the model without its facts
        log.info("ollama: no details read from the weights of %s (%s)", path.name, type(exc).__name__)
    digest = hashlib.sha256(repr(stamp).encode()).hexdigest()
    return Facts(
        format=read.get("format") or _format_of(files),
        family=read.get("family", ""),
        parameter_count=read.get("parameter_count"),
        quantization=read.get("quantization", ""),
        size=sum(f.stat().st_size for f in files),
        modified=max((s[2] for s in stamp[1:]), default=0.0),
        digest=digest,
        source=source,
        info=read.get("info", {}),
        chat_template=read.get("chat_template", ""),
    )


def read_facts(root: Path, model: LoadedModel) -> Facts:
    """A loaded model's facts (blocking: file system reads; call off the event loop)."""
    facts = _read_files(root, model.folder, model.config)
    if facts is None:
        return _served_facts(model)
    if isinstance(model, LoadedLLM) and not facts.family:
        facts = dataclasses.replace(facts, family=model.scheduler.info.model_type)
    return facts


def read_folder_facts(root: Path, folder: str, config: AnyModelConfig) -> Facts:
    """The facts of a model that is not loaded, from its folder's files only (blocking)."""
    facts = _read_files(root, folder, config)
    if facts is not None:
        return facts
    modified = _config_time(root, folder)
    return Facts(digest=hashlib.sha256(f"{folder}:{modified}".encode()).hexdigest(), modified=modified)


def _config_time(root: Path, folder: str) -> float:
    try:
        found = find_model_dir(root, folder)
        return found.config_path.stat().st_mtime if found is not None else 0.0
    except (OSError, ValueError):
        return 0.0


def _read_files(root: Path, folder: str, config: AnyModelConfig) -> Facts | None:
    """The facts the weights' files tell, or None when they are not local files or cannot be read."""
    try:
        found = _weights(root, folder, config)
        if found is None:
            return None
        config_file, path, source = found
        files = _files(path)
        stamp = (
            folder_fingerprint(config_file.parent),
            *((str(f), f.stat().st_size, f.stat().st_mtime) for f in [config_file, *files]),
        )
        return _read(config_file, path, source, stamp)
    except (ConfigError, OSError, ValueError) as exc:
        log.info("ollama: model '%s': weights not read (%s)", folder, type(exc).__name__)
        return None


def _served_facts(model: LoadedModel) -> Facts:
    """What a model whose weights are not local files says of itself."""
    if isinstance(model, LoadedLLM):
        info = model.scheduler.info
        return Facts(
            family=info.model_type,
            quantization=DTYPES.get(info.dtype, info.dtype.upper()),
            digest=hashlib.sha256(f"{model.folder}:{model.created}".encode()).hexdigest(),
            modified=float(model.created),
        )
    return Facts(
        digest=hashlib.sha256(f"{model.folder}:{model.created}".encode()).hexdigest(), modified=float(model.created)
    )
