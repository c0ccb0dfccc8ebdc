"""Phi-4-mini's calls: `<|tool_call|>[{"name": ..., "arguments": {...}}]<|/tool_call|>` (its tools are given in the
system turn between `<|tool|>` and `<|/tool|>`); `functools[...]`, which some of its answers use, is read too."""

from __future__ import annotations

import json
from typing import Any

from gateway.llm.tool_parsers.base import args_object, json_objects
from gateway.llm.tool_parsers.region import RegionParser

OPEN, CLOSE = "<|tool_call|>", "<|/tool_call|>"


class Phi4MiniParser(RegionParser):
    name = "phi4_mini_json"
    markers = (OPEN, "functools")
    needs_special_tokens = True  # <|tool_call|> is a special token of its vocabulary

    def read_calls(self, region: str) -> tuple[list[Any], int]:
        objects, end = json_objects(region, separators="[,]")
        rest = region[end:]
        if rest.lstrip().startswith(CLOSE):
            end = len(region) - len(rest.lstrip()) + len(CLOSE)
        return [obj for obj, _ in objects], end

    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        return (
            "You are a helpful assistant with some tools."
            f"<|tool|>{json.dumps([t['function'] for t in tools], ensure_ascii=False)}<|/tool|>\n"
            f'To call tools, answer with {OPEN}[{{"name": <function-name>, "arguments": <args-json-object>}}, ...]'
            f"{CLOSE}"
        )

    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        objs = [{"name": c["name"], "arguments": args_object(c["arguments"])} for c in calls]
        return OPEN + json.dumps(objs, ensure_ascii=False) + CLOSE

    def grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        return self.list_grammar(tools, parallel)
