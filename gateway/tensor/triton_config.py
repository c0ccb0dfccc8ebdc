"""The configuration of a tensor model as Triton shows it: the JSON of `/v2/models/{m}/config`, which is also
what the gRPC ModelConfig message is parsed from (Triton's field names and enum spellings)."""

from __future__ import annotations

from typing import Any

from engines.types import TensorSpec
from gateway.repository.tensor_config import WIRE_DATATYPES, TensorModelConfig, triton_datatype


def config_json(
    name: str, config: TensorModelConfig, inputs: list[TensorSpec], outputs: list[TensorSpec]
) -> dict[str, Any]:
    """The config in Triton's JSON form (what `/v2/models/{m}/config` returns; also the gRPC ModelConfig)."""
    doc = config.model_dump(
        exclude={"model", "owned_by", "input", "output", "name", "load", "keep_alive"}, exclude_none=True
    )  # load, keep_alive: Switchyard's, not in Triton's schema
    doc = {"name": name, **doc}
    declared_in = {t.name: t for t in config.input}
    declared_out = {t.name: t for t in config.output}

    def tensor(spec: TensorSpec, declared: Any, is_input: bool) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": spec.name, "data_type": triton_datatype(spec.datatype), "dims": spec.dims}
        if declared is not None and declared.reshape is not None:
            entry["reshape"] = {"shape": declared.reshape.shape}
        if is_input:
            entry["optional"] = spec.optional
        return entry

    doc["input"] = [tensor(s, declared_in.get(s.name), True) for s in inputs]
    doc["output"] = [tensor(s, declared_out.get(s.name), False) for s in outputs]
    doc["parameters"] = {k: {"string_value": v} for k, v in config.parameters.items()}
    doc["instance_group"] = [
        {
            "name": g.name or f"{name}_{i}",
            "kind": "KIND_CPU",
            "count": g.count,
            **({"rate_limiter": g.rate_limiter.model_dump(by_alias=True)} if g.rate_limiter is not None else {}),
        }
        for i, g in enumerate(config.instance_group)
    ] or [{"name": name, "kind": "KIND_CPU", "count": 1}]
    doc.setdefault("backend", config.resolved_backend)
    for key in ("dynamic_batching", "sequence_batching"):
        section = doc.get(key)
        if section and "priority_queue_policy" in section:
            section["priority_queue_policy"] = {str(k): v for k, v in section["priority_queue_policy"].items()}
    policy = doc.get("version_policy") or {}
    doc["version_policy"] = policy if any(v is not None for v in policy.values()) else {"latest": {"num_versions": 1}}
    _triton_datatypes(doc)
    return doc


def _triton_datatypes(node: Any) -> None:
    """Wire datatypes (FP32) nested anywhere in the config back to Triton's enum names (TYPE_FP32)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "data_type" and isinstance(value, str) and value in WIRE_DATATYPES:
                node[key] = triton_datatype(value)
            else:
                _triton_datatypes(value)
    elif isinstance(node, list):
        for item in node:
            _triton_datatypes(item)
