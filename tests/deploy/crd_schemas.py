"""Validate custom resources offline against the schemas of their CRDs (vendored in tests/deploy/crds/, each with
its source and release noted in its header).

The API server checks a custom resource against its CRD's `openAPIV3Schema` and, under `kubectl apply
--validate=strict`, refuses fields the schema does not know. Here the schema is checked with jsonschema after
closing every object that lists its `properties` (unless it keeps unknown fields), so a misspelt field fails too.
CEL rules (`x-kubernetes-validations`) are not evaluated.
"""

from __future__ import annotations

import copy
import functools
import gzip
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRDS = Path(__file__).resolve().parent / "crds"
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml reads the 2 MB InferenceService CRD in a second


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema.setdefault("additionalProperties", False)
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _load() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the strict JSON schema of that resource, from every vendored CRD."""
    out: dict[tuple[str, str], dict] = {}
    for path in sorted([*CRDS.glob("*.yaml"), *CRDS.glob("*.yaml.gz")]):
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text(encoding="utf-8")
        for crd in yaml.load_all(text, Loader=_LOADER):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            for version in spec["versions"]:
                if version.get("served", True):
                    schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
                    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
                    out[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = schema
    return out


@functools.cache
def schemas() -> dict[tuple[str, str], dict]:
    return _load()


def validate(doc: dict) -> None:
    """Raise AssertionError naming the resource and every schema violation."""
    key = (doc.get("apiVersion", ""), doc.get("kind", ""))
    known = schemas()
    assert key in known, f"no vendored CRD for {key}; known: {sorted(known)}"
    validator = jsonschema.Draft7Validator(known[key])
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    name = f"{key[1]} {doc.get('metadata', {}).get('name')}"
    assert not errors, f"{name}: " + "; ".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)
