"""The console's Overview: every model folder of the repository with its state and facts, and the server's own.

Loaded models describe themselves (engine facts: dtype, context length, versions); folders that are not loaded
show what their config file says (backend), or the reason it cannot be read. States use the console's words,
mapped from the repository index's (Triton's) states: ready, loading, unloading, unloaded, failed.
"""

from __future__ import annotations

import os
from typing import Any

from engines.cpu_budget import cpu_budget as detect_cpu_budget
from gateway import __version__
from gateway.errors import ConfigError
from gateway.repository.layout import find_model_dir
from gateway.repository.loaded_model import LoadedLLM, LoadedModel, LoadedTensorModel
from gateway.repository.model_config import ModelConfig, parse_model_config
from gateway.repository.model_control import ModelControl
from gateway.repository.tensor_config import TensorModelConfig
from gateway.tensor.embedding import can_embed


def cpu_budget() -> dict[str, Any]:
    """The CPUs this process may run on (`visible`: its affinity mask), and the budget the engines plan with
    (`budget`: the mask capped by the cgroup quota, engines/cpu_budget.py; the same figure as the
    switchyard_cpu_limit gauge), with the reason; the page shows `budget` when present."""
    try:
        visible = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        visible = os.cpu_count() or 1
    try:
        budget = detect_cpu_budget()
    except ValueError:  # a bad OMP_NUM_THREADS: the engines refuse to load and say why
        return {"visible": visible, "host": os.cpu_count(), "budget": None}
    return {
        "visible": visible,
        "host": os.cpu_count(),
        "budget": budget.cpus,
        "threads": budget.threads,
        "reason": budget.reason,
    }


def _backend(config: Any) -> str:
    if isinstance(config, TensorModelConfig):
        try:
            return config.resolved_backend
        except ValueError:
            return config.backend or config.platform or "?"
    return str(getattr(config, "backend", "?"))


def _loaded_facts(model: LoadedModel) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "served_name": model.name,
        "kind": model.kind,
        "backend": _backend(model.config),
        "versions": [str(v) for v in model.versions],
        "max_model_len": model.max_model_len,
        "in_flight": model.in_flight,
        "load_seconds": round(model.load_seconds, 2),
    }
    if isinstance(model, LoadedLLM):
        info = model.scheduler.info
        facts.update(dtype=info.dtype, model_type=info.model_type)
    elif isinstance(model, LoadedTensorModel):
        entry = model.tensor.version()
        facts["dtype"] = entry.outputs[0].datatype if entry.outputs else None  # the main output's
        facts["embeddings"] = can_embed(model.tensor)
    return facts


def _folder_facts(control: ModelControl, name: str) -> dict[str, Any]:
    """What the config file of a model that is not loaded says (no weights are touched)."""
    try:
        folder = find_model_dir(control.root, name)
        if folder is None:
            return {}
        config = parse_model_config(folder.config_path, name)
    except (ConfigError, ValueError, OSError) as exc:
        return {"config_error": control.states.public(str(exc))[:300]}
    kind = "tensor" if isinstance(config, TensorModelConfig) else "llm"
    facts: dict[str, Any] = {"backend": _backend(config), "kind": kind}
    if isinstance(config, ModelConfig):
        facts.update(
            dtype=config.dtype, max_model_len=config.max_model_len, served_name=config.served_model_name or name
        )
    return facts


def _state(row: dict[str, str]) -> tuple[str, str]:
    state, reason = row.get("state", ""), row.get("reason", "")
    if state == "READY":
        return "ready", reason
    if state == "LOADING":
        return "loading", ""
    if state == "UNLOADING":
        return "unloading", ""
    if state == "UNAVAILABLE":
        return ("unloaded", "") if reason == "unloaded" else ("failed", reason)
    return "unloaded", ""


def models(control: ModelControl) -> list[dict[str, Any]]:
    """One entry per model folder (its versions merged), in folder order; a failed load's reason with it."""
    loaded = {m.folder: m for m in control.models.all_models()}
    on_request = control.catalog.on_request_models()
    rows: dict[str, dict[str, Any]] = {}
    for row in control.states.index():
        name = row["name"]
        if name in rows:
            continue
        state, reason = _state(row)
        entry: dict[str, Any] = {"name": name, "state": state, "reason": reason}
        model = loaded.get(name)
        entry.update(_loaded_facts(model) if model is not None else _folder_facts(control, name))
        entry.update(control.residency.describe(name), on_request=name in on_request)  # bytes, keep-alive
        rows[name] = entry
    for folder, model in loaded.items():  # a loaded model whose folder has gone (poll mode removes it next scan)
        rows.setdefault(folder, {"name": folder, "state": "ready", "reason": "", **_loaded_facts(model)})
    return list(rows.values())


def server(
    config: Any, admin_enabled: bool, auth_required: bool, ready: bool, routes: frozenset[str]
) -> dict[str, Any]:
    return {
        "name": "switchyard",
        "version": __version__,
        "ready": ready,
        "model_control_mode": config.model_control_mode,
        "admin_enabled": admin_enabled,
        "auth_required": auth_required,
        "cpu": cpu_budget(),
        "features": {"rerank": "/v1/rerank" in routes},
    }
