"""The decoder families the native engine serves: one module per family (or group of families sharing a layer),
each with `MODEL_TYPES` (transformers' `config.model_type` values) and `build(hf_model, blocks, kernels, packed) ->
DecoderModel` (decoder.py). A new family is a new module listed in `_MODULES`."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from engines.interface import UnsupportedModelError

_MODULES = ("llama", "granite", "phi3", "olmo2", "gemma", "moe", "gpt_oss")
NAMES = {"gemma3_text": "gemma3"}  # model types as users know them, where transformers' differs


def _families() -> dict[str, ModuleType]:
    found = {}
    for name in _MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        found.update({model_type: module for model_type in module.MODEL_TYPES})
    return found


FAMILIES: dict[str, ModuleType] = _families()
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


def check_supported(model_type: str | None, architectures: list[str] | None = None) -> None:
    """Raise UnsupportedModelError unless the native engine has a family for `model_type` (a config's)."""
    if model_type in FAMILIES:
        return
    arch = f" ({', '.join(architectures)})" if architectures else ""
    served = ", ".join(sorted({NAMES.get(t, t) for t in FAMILIES}))
    raise UnsupportedModelError(
        f"model type '{model_type}'{arch} is not supported by the native engine (backend: pytorch), which serves "
        f"{served}; set `backend: vllm` in the model's config to serve it with vLLM"
    )


def build_model(hf_model: Any, blocks: Any, kernels: Any, packed: Any) -> Any:
    """The `DecoderModel` of transformers' `hf_model` (its layers' weights taken over; see decoder.py)."""
    config = hf_model.config
    check_supported(config.model_type, getattr(config, "architectures", None))
    return FAMILIES[config.model_type].build(hf_model, blocks, kernels, packed)
