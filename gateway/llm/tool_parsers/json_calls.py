"""Calls written as bare JSON: the generic `json` dialect (the whole answer is a call object or a list of them) and
Llama 3.x's (`{"name": ..., "parameters": {...}}`, after `<|python_tag|>` or at the start of the answer, several
joined by `; `), which its template asks for when it renders `tools`."""

from __future__ import annotations

import json
import re
from typing import Any

from gateway.llm.grammar_compiler import lark_json
from gateway.llm.tool_parsers.base import (
    MAX_PARALLEL_CALLS,
    ParsedCall,
    StreamEvent,
    ToolCallDelta,
    ToolParser,
    ToolStreamer,
    args_object,
    call_from_object,
    call_schema,
    json_objects,
    loads,
    new_call_id,
    partial_object_call,
    tools_json_lines,
)
from gateway.llm.tool_parsers.region import RegionParser


class JsonParser(ToolParser):
    name = "json"
    _FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)

    def parse(self, text: str, names: set[str]) -> tuple[str | None, list[ParsedCall]]:
        stripped = text.strip()
        fenced = self._FENCE.match(stripped)
        data = loads(fenced.group(1) if fenced else stripped)
        items = data if isinstance(data, list) else [data]
        calls = [call_from_object(item, names) for item in items]
        if not items or any(c is None for c in calls):
            return text, []
        return None, [c for c in calls if c is not None]

    def parse_forced(self, text: str, names: set[str]) -> list[ParsedCall]:
        objects, end = json_objects(text, separators="[,]")
        calls = [c for c in (call_from_object(obj, names) for obj, _ in objects) if c is not None]
        if text[end:].strip() or not calls:
            cut = partial_object_call(text[end:], names)
            calls += [cut] if cut is not None else []
        return calls

    def streamer(self, names: set[str], trusted: bool, max_calls: int) -> ToolStreamer:
        return _JsonStreamer(self, names, trusted, max_calls)

    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        return (
            "You have access to the following functions:\n"
            f"{tools_json_lines(tools)}\n\n"
            "To call a function, respond with only a JSON object of the form "
            '{"name": <function-name>, "arguments": <args-json-object>}, or a JSON list of such objects to call '
            "several. Otherwise answer normally."
        )

    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        objs = [{"name": c["name"], "arguments": args_object(c["arguments"])} for c in calls]
        return json.dumps(objs[0] if len(objs) == 1 else objs, ensure_ascii=False)

    def grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        schema = call_schema(tools)
        if parallel:
            schema = {"type": "array", "items": schema, "minItems": 1, "maxItems": MAX_PARALLEL_CALLS}
        return f"start: body\nbody: {lark_json(schema)}\n"


class _JsonStreamer(ToolStreamer):
    """Text that starts like JSON is held to the end and then parsed; anything else streams as content."""

    def __init__(self, parser: JsonParser, names: set[str], trusted: bool, max_calls: int) -> None:
        self._parser = parser
        self._names = names
        self._trusted = trusted
        self._max_calls = max_calls
        self._buf = ""
        self._holding: bool | None = None
        self.calls = 0

    def feed(self, text: str) -> list[StreamEvent]:
        if self._holding is None:
            self._buf += text
            head = self._buf.lstrip()
            if not head:
                return []
            self._holding = head[0] in "{[`"
            text, self._buf = ("", self._buf) if self._holding else (self._buf, "")
        elif self._holding:
            self._buf += text
            return []
        return [text] if text else []

    def finish(self) -> list[StreamEvent]:
        rest, self._buf = self._buf, ""
        if not rest:
            return []
        if self._trusted:
            calls = self._parser.parse_forced(rest, self._names)
        else:
            _content, calls = self._parser.parse(rest, self._names)
            if not calls:
                return [rest]
        out: list[StreamEvent] = []
        for call in calls[: self._max_calls]:
            out.append(ToolCallDelta(self.calls, new_call_id(), call.name))
            if call.arguments:
                out.append(ToolCallDelta(self.calls, arguments=call.arguments))
            self.calls += 1
        return out


class Llama3JsonParser(RegionParser):
    """Llama 3.1-3.3: the template asks for `{"name": function name, "parameters": dictionary of argument name and its
    value}`; the model may open with `<|python_tag|>` and join parallel calls with `; `. Calls count only at the
    start of the answer (a JSON object further on is content)."""

    name = "llama3_json"
    markers = ("<|python_tag|>",)
    bare_start = "{"
    at_start_only = True

    def read_calls(self, region: str) -> tuple[list[Any], int]:
        objects, end = json_objects(region, separators=";")
        return [obj for obj, _ in objects], end

    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        return (
            "You have access to the following functions. To call a function, respond with only a JSON object in the "
            'format {"name": function name, "parameters": dictionary of argument name and its value}. Separate '
            "several calls with '; '. Do not use variables.\n\n"
            f"{tools_json_lines(tools)}"
        )

    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        return "; ".join(
            json.dumps({"name": c["name"], "parameters": args_object(c["arguments"])}, ensure_ascii=False)
            for c in calls
        )

    def grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        start = f'start: body ("; " body){{0,{MAX_PARALLEL_CALLS - 1}}}' if parallel else "start: body"
        return f"{start}\nbody: {lark_json(call_schema(tools, 'parameters'))}\n"
