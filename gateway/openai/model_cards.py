"""/v1/models' entries: OpenAI's model object for every model a request may name, loaded or not, with its `state`.

A loaded model is `loaded`; a model of the repository that loads on request (`--model-control-mode=on_demand` or
`load: on_request`) and is not loaded is `not-loaded`, `loading` while its load runs, or `failed` (with `reason`)
after its last load failed. The OpenAI fields keep their types (`created` is the config file's time for a model not
loaded), so OpenAI's SDKs read the list unchanged and extra fields are ignored by them.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import ModelNotFoundError
from gateway.repository.loaded_model import LoadedModel
from gateway.repository.model_config import AnyModelConfig, ModelConfig
from gateway.repository.model_control import ModelControl


def loaded_card(m: LoadedModel) -> dict[str, Any]:
    return {
        "id": m.name,
        "object": "model",
        "created": m.created,
        "owned_by": m.config.owned_by,
        "root": m.name,
        "parent": None,
        "max_model_len": m.max_model_len,
        "state": "loaded",
    }


def _served_name(folder: str, config: AnyModelConfig) -> str:
    return (config.served_model_name if isinstance(config, ModelConfig) else None) or folder


def _unloaded_card(control: ModelControl, folder: str, config: AnyModelConfig) -> dict[str, Any]:
    name = _served_name(folder, config)
    state = control.states.get(folder)
    card: dict[str, Any] = {
        "id": name,
        "object": "model",
        "created": _created(control, folder),
        "owned_by": config.owned_by,
        "root": name,
        "parent": None,
        "max_model_len": config.max_model_len if isinstance(config, ModelConfig) else None,
        "state": "not-loaded",
    }
    if control.residency.describe(folder).get("loading"):
        card["state"] = "loading"
    elif state.state == "UNAVAILABLE" and state.reason and state.reason != "unloaded":
        card.update(state="failed", reason=state.reason)
    return card


def _created(control: ModelControl, folder: str) -> int:
    for name in ("config.yaml", "config.yml", "config.pbtxt"):
        try:
            return int((control.root / folder / name).stat().st_mtime)
        except OSError:
            continue
    return 0


def model_cards(control: ModelControl) -> list[dict[str, Any]]:
    """Every loaded model, then every model that loads on request and is not loaded, by name."""
    cards = [loaded_card(m) for m in control.models.all_models()]
    loaded = {m.folder for m in control.models.all_models()}
    taken = {card["id"] for card in cards}
    for folder, config in sorted(control.catalog.on_request_models().items()):
        if folder not in loaded and _served_name(folder, config) not in taken:
            cards.append(_unloaded_card(control, folder, config))
    return cards


def model_card(control: ModelControl, name: str) -> dict[str, Any]:
    """One model's entry; 404 for a name no request can reach."""
    loaded = control.models.find(name)
    if loaded is not None:
        return loaded_card(loaded)
    folder = control.catalog.requestable(name)
    config = control.catalog.on_request_models().get(folder or "")
    if folder is None or config is None:
        raise ModelNotFoundError(name)
    return _unloaded_card(control, folder, config)


def adapter_card(m: LoadedModel) -> dict[str, Any]:
    """A LoRA adapter as vLLM lists it: root is its path, parent its base model."""
    parent = m.parent  # type: ignore[attr-defined]
    return {
        "id": m.name,
        "object": "model",
        "created": m.created,
        "owned_by": m.config.owned_by,
        "root": m.adapter.given_path,  # type: ignore[attr-defined]
        "parent": parent.name,
        "max_model_len": m.max_model_len,
    }
