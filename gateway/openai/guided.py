"""Guided decoding for a request: `response_format` / `structured_outputs` as an engine-agnostic `GuidedSpec`,
compiled by the model's grammar compiler (`LoadedLLM.grammar`, gateway/llm/grammar_compiler.py) when its engine
applies our masks, passed on as it is when the engine enforces specs itself (vLLM, remote upstreams).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engines.grammar import CompiledGrammar
from engines.types import GuidedSpec
from gateway.errors import InvalidRequestError
from gateway.llm.grammar_compiler import check_json_schema, close_objects
from gateway.repository.loaded_model import LoadedLLM


def json_spec(schema: Any, param: str, where: str = "schema") -> GuidedSpec:
    """A checked JSON Schema as a spec, its objects closed (what every engine then enforces as given)."""
    check_json_schema(schema, param, where)
    return GuidedSpec("json", close_objects(schema), param)


@dataclass
class Guidance:
    """A request's guided decoding: the spec every engine gets, and its compiled grammar when the engine applies
    our masks (None when the engine enforces the spec itself)."""

    spec: GuidedSpec
    compiled: CompiledGrammar | None = None


async def guidance_for(spec: GuidedSpec, model: LoadedLLM) -> Guidance:
    """Compile `spec` for the model when its engine needs masks; otherwise pass it on as it is."""
    if model.enforces_guided_spec:
        return Guidance(spec)
    # a spec that names no field (built outside a request) is reported as vLLM's structured_outputs
    return Guidance(spec, await model.grammar.compile(spec, spec.param or "structured_outputs"))


def request_spec(req: Any) -> GuidedSpec | None:
    """The constraint a request asks for with `response_format` (OpenAI) or `structured_outputs` (vLLM), checked,
    naming the request field that errors name (`param`); None for none."""
    fmt, wanted = req.response_format, req.structured_outputs
    if fmt is not None and fmt.type == "json_object":
        return json_spec({"type": "object"}, "response_format")
    if fmt is not None and fmt.type == "json_schema":
        return json_spec(fmt.json_schema.schema_, "response_format", "response_format.json_schema.schema")
    if wanted is None:
        return None
    param = "structured_outputs"
    if wanted.json_object:
        return json_spec({"type": "object"}, param)
    if wanted.json_ is not None:
        schema = wanted.json_
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError:
                raise InvalidRequestError("structured_outputs.json is not valid JSON", param=param) from None
        return json_spec(schema, param, "structured_outputs.json")
    if wanted.regex is not None:
        return GuidedSpec("regex", wanted.regex, param)
    if wanted.choice is not None:
        return GuidedSpec("choice", list(wanted.choice), param)
    return GuidedSpec("lark", wanted.grammar, param)


async def request_guidance(req: Any, model: LoadedLLM) -> Guidance | None:
    """`request_spec`, prepared for the model's engine."""
    spec = request_spec(req)
    return None if spec is None else await guidance_for(spec, model)
