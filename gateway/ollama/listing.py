"""The models the Ollama API lists and describes: every model a request may name, loaded or not.

Ollama's /api/tags lists every local model, loaded or not, and /api/ps the loaded ones; editors fill their model
pickers from /api/tags. So the list here is the loaded LLMs and embedding models, then the models of the repository
that load on request (`--model-control-mode on_demand`, `load: on_request`) and are not loaded, told apart by their
config alone (an LLM's config, or a tensor model with the embedding contract: TEXT BYTES in, EMBEDDING FP32 out, or
`parameters.task: embed`). Looking a model up here never loads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.ollama.lookup import LATEST, find, served
from gateway.repository.loaded_model import LoadedModel
from gateway.repository.model_config import AnyModelConfig, ModelConfig
from gateway.repository.model_control import ModelControl
from gateway.repository.tensor_config import TensorModelConfig


@dataclass(frozen=True)
class Listed:
    """A model as the Ollama API lists it: `entry` is its loaded copy, None while it waits for a request to load it."""

    name: str
    folder: str
    config: AnyModelConfig
    entry: LoadedModel | None = None


def config_embeds(config: AnyModelConfig) -> bool:
    """Whether a tensor model's config says it embeds text (what `tensor.embedding.can_embed` checks once loaded)."""
    if not isinstance(config, TensorModelConfig):
        return False
    if config.parameters.get("task") == "embed":
        return True
    inputs = {t.name: t.data_type for t in config.input}
    outputs = {t.name: t.data_type for t in config.output}
    return inputs.get("TEXT") == "BYTES" and outputs.get("EMBEDDING") == "FP32"


def listable(config: AnyModelConfig) -> bool:
    """Whether the Ollama API serves a model of this config once loaded: LLMs and embedding models."""
    return isinstance(config, ModelConfig) or config_embeds(config)


def _served_name(folder: str, config: AnyModelConfig) -> str:
    return (config.served_model_name if isinstance(config, ModelConfig) else None) or folder


def _loaded(model: LoadedModel) -> Listed:
    return Listed(model.name, model.folder, model.config, model)


def listed_models(control: ModelControl) -> list[Listed]:
    """Every model the Ollama API serves, loaded or loading on request, by name (/api/tags)."""
    loaded = [m for m in control.models.all_models() if served(m)]
    items = {m.name: _loaded(m) for m in loaded}
    folders = {m.folder for m in control.models.all_models()}
    for folder, config in control.catalog.on_request_models().items():
        name = _served_name(folder, config)
        if folder not in folders and name not in items and listable(config):
            items[name] = Listed(name, folder, config)
    return [items[name] for name in sorted(items)]


def find_listed(control: ModelControl, name: str) -> Listed | None:
    """The model `name` names (`:latest` or not), loaded or not; None if the Ollama API does not serve it. Never
    loads it."""
    model = find(control.models, name)
    if model is not None:
        return _loaded(model) if served(model) else None
    for candidate in dict.fromkeys((name, name.removesuffix(LATEST))):
        folder = control.catalog.requestable(candidate)
        config = control.catalog.on_request_models().get(folder or "")
        if folder is not None and config is not None and listable(config):
            return Listed(_served_name(folder, config), folder, config)
    return None
