"""The family registry (engines/pytorch/models/): a model of a family the native engine does not serve is refused
with a typed error that names its model type, the families served and the fix, before any weight loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engines.interface import UnsupportedModelError
from engines.pytorch.engine import PyTorchEngine
from engines.pytorch.models import SUPPORTED_MODEL_TYPES, check_supported

SERVED = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "granite", "olmo2")


def test_the_registry_serves_the_dense_families() -> None:
    assert set(SERVED) - {"gemma3"} | {"gemma3_text"} <= set(SUPPORTED_MODEL_TYPES)
    for model_type in SUPPORTED_MODEL_TYPES:
        check_supported(model_type)


def test_an_unsupported_architecture_is_refused_before_its_weights_load(tmp_path: Path) -> None:
    """The folder has a config.json and no weights: the refusal comes from the config alone."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "falcon", "architectures": ["FalconForCausalLM"]}))
    with pytest.raises(UnsupportedModelError) as err:
        PyTorchEngine(tmp_path, dtype="float32", kv_cache_tokens=64)
    message = str(err.value)
    assert "'falcon'" in message and "FalconForCausalLM" in message and "backend: vllm" in message
    for family in SERVED:
        assert family in message
    assert isinstance(err.value, ValueError)  # a bad model config, as the gateway reports ValueErrors
