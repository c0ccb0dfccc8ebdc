"""Load weights and tokenizer from an HF folder or a GGUF file, caching dequantized GGUF weights.

transformers dequantizes GGUF on every load (tens of seconds for a small model). The first load saves the
result as safetensors in a cache folder keyed by the file's identity, so later starts take about a second.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("switchyard.engines.pytorch")

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_cache_dir() -> Path:
    env = os.environ.get("SWITCHYARD_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "switchyard"


def _gguf_cache_key(gguf: Path) -> str:
    import transformers

    stat = gguf.stat()
    ident = f"{gguf.name}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    return f"{gguf.stem}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def _convert_gguf(gguf: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors (first start only; cached in %s)", gguf.name, target.parent)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The dequantized model is plain float weights; drop the GGUF marker so transformers lets us save it.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").exists():  # a concurrent start may have won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_hf_folder(source: Path, gguf_file: str | None = None, cache_dir: Path | None = None) -> Path:
    """Return an HF folder for `source`: the folder itself, or the cached conversion of a GGUF file."""
    gguf = source / gguf_file if gguf_file else source
    if gguf.is_file() and gguf.suffix == ".gguf":
        target = (cache_dir or default_cache_dir()) / "gguf" / _gguf_cache_key(gguf)
        if not (target / "config.json").exists():
            _convert_gguf(gguf, target)
        return target
    if (source / "config.json").is_file():
        return source
    raise FileNotFoundError("no config.json (HF folder) or .gguf file found at the model source")


def load_hf(folder: Path, dtype: str) -> tuple[Any, Any]:
    """Load (model, tokenizer) from an HF folder on the CPU, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=TORCH_DTYPES[dtype])
    model.eval()
    return model, tokenizer
