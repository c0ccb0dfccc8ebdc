"""Mistral's calls, after the `[TOOL_CALLS]` control token: a JSON list `[{"name": ..., "arguments": {...}}]`
(Mistral 7B v0.3, Nemo, Small 3.0/3.1: tokenizers up to v7) or, from v11, one `name[ARGS]{...}` per call, each after
its own `[TOOL_CALLS]` (and an optional `[CALL_ID]id`: Mistral Small 3.2, Devstral, Magistral). Mistral's templates
refuse call ids that are not 9 alphanumeric characters."""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.llm.tool_parsers.base import (
    ParsedCall,
    args_object,
    json_objects,
    partial_object_call,
    resolve_name,
)
from gateway.llm.tool_parsers.region import RegionParser

MARKER = "[TOOL_CALLS]"
_NAMED = re.compile(r"\s*([^\s\[\]{}]+)(?:\[CALL_ID\][A-Za-z0-9]*)?\[ARGS\]")


class MistralParser(RegionParser):
    name = "mistral"
    markers = (MARKER,)
    needs_special_tokens = True  # [TOOL_CALLS] and [ARGS] are control tokens, dropped from text by default

    def read_calls(self, region: str) -> tuple[list[Any], int]:
        if region.lstrip()[:1] in ("[", "{", ""):
            objects, end = json_objects(region, separators="[,]")
            return [obj for obj, _ in objects], end
        decoder = json.JSONDecoder()
        found: list[Any] = []
        pos = 0
        while True:
            m = _NAMED.match(region, pos)
            if m is None:
                return found, pos
            at = len(region) - len(region[m.end() :].lstrip())
            try:
                args, end = decoder.raw_decode(region, at)
            except ValueError:
                return found, pos
            found.append({"name": m.group(1), "arguments": args})
            pos = end
            rest = region[pos:].lstrip()
            if rest.startswith(MARKER):
                pos = len(region) - len(rest) + len(MARKER)

    def partial_call(self, tail: str, names: set[str]) -> ParsedCall | None:
        if tail.lstrip()[:1] in ("[", "{", ""):
            return partial_object_call(tail.lstrip().lstrip("[,"), names)
        m = _NAMED.match(tail)
        if m is not None:
            name = resolve_name(m.group(1), names, True)
            return ParsedCall(name, tail[m.end() :].lstrip()) if name is not None else None
        head = tail.lstrip()
        name = resolve_name(head.split("[", 1)[0], names, "[" in head)
        return ParsedCall(name, "") if name is not None else None

    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        return (
            f"[AVAILABLE_TOOLS]{json.dumps(tools, ensure_ascii=False)}[/AVAILABLE_TOOLS]\n"
            f"To call functions, answer with {MARKER} followed by a JSON list of "
            '{"name": <function-name>, "arguments": <args-json-object>} objects.'
        )

    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        objs = [{"name": c["name"], "arguments": args_object(c["arguments"])} for c in calls]
        return MARKER + json.dumps(objs, ensure_ascii=False)

    def grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        # The control token is left out: the constrained answer is the list itself (parse_forced reads it so).
        return self.list_grammar(tools, parallel)

    def template_call_id(self, call_id: str) -> str:
        return re.sub(r"[^A-Za-z0-9]", "", call_id)[-9:].rjust(9, "0")
