"""The gateway-side tokenizer of a remote model, from an HF folder or a GGUF file.

The gateway renders chat templates and counts tokens itself and sends token ids upstream, so it needs the
upstream model's own tokenizer. Reading a tokenizer out of a GGUF file takes several seconds; the result is saved
as an HF tokenizer folder in the cache (keyed by the file's identity), so later starts take under a second.
"""

from __future__ import annotations

import logging
from pathlib import Path

from engines.gguf_cache import cache_entry, publish
from engines.hf_tokenizer import HFTokenizer

log = logging.getLogger("switchyard.engines.remote")


def load_tokenizer(source: Path, cache_dir: Path) -> HFTokenizer:
    """Load from an HF folder (with tokenizer files) or a .gguf file; raise ValueError saying what to point at."""
    from transformers import AutoTokenizer

    if source.is_file() and source.suffix == ".gguf":
        target = cache_entry(cache_dir / "tokenizers", source)
        if not (target / "tokenizer_config.json").exists():
            log.info("reading the tokenizer out of %s (first start only; cached)", source.name)
            tok = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
            publish(target, (tok,), "tokenizer_config.json")
        source = target
    if not source.is_dir() or not any((source / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise ValueError("the tokenizer source must be an HF folder holding tokenizer.json, or a .gguf file")
    return HFTokenizer(AutoTokenizer.from_pretrained(source))
