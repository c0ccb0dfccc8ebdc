"""Tool-call dialects: how a model writes calls, read back into OpenAI `tool_calls` (whole and streamed).

A dialect is chosen per model with `parameters.tool_parser` in its config:

* `hermes` (default): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, several in a row for
  parallel calls (Hermes, Qwen 2.5/3, many fine-tunes).
* `json`: the whole answer is `{"name": ..., "arguments": {...}}` or a list of them (Llama 3.x style).

Each dialect also knows how to describe tools in a system prompt and how to write past calls back as text, for
chat templates that ignore `tools` / `tool_calls`, and gives the Lark grammar that forces its own format when
`tool_choice` is `required` or names a function (see tools.py).
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.ids import random_hex
from gateway.openai.guided import lark_json

MAX_PARALLEL_CALLS = 16


def new_call_id() -> str:
    return f"call_{random_hex()[:24]}"


@dataclass
class ParsedCall:
    name: str
    arguments: str  # JSON text


@dataclass
class ToolCallDelta:
    """One streamed piece of a call: id and name come once, on the first piece; then argument fragments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {
            "index": self.index, "id": self.id, "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


StreamEvent = str | ToolCallDelta  # a str is content text


def call_from_object(obj: Any, names: set[str]) -> ParsedCall | None:
    """`{"name": ..., "arguments"|"parameters": {...}}` naming a known tool -> a call; anything else -> None."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker` (text to hold back)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": t["function"].get("parameters") or {"type": "object", "properties": {}},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


class ToolStreamer(ABC):
    """Turns a choice's text deltas into content and tool-call deltas."""

    calls: int = 0

    @abstractmethod
    def feed(self, text: str) -> list[StreamEvent]: ...

    @abstractmethod
    def finish(self) -> list[StreamEvent]: ...


class ToolParser(ABC):
    name: str

    @abstractmethod
    def parse(self, text: str, names: set[str]) -> tuple[str | None, list[ParsedCall]]:
        """Split a finished answer into content (None if nothing but calls) and calls."""

    @abstractmethod
    def streamer(self, names: set[str], trusted: bool, max_calls: int) -> ToolStreamer:
        """`trusted`: output is grammar-constrained to this dialect, so arguments may be streamed as they come."""

    @abstractmethod
    def system_prompt(self, tools: list[dict[str, Any]]) -> str: ...

    @abstractmethod
    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        """Past calls (`{"name", "arguments": dict|str}`) as the model would have written them."""

    @abstractmethod
    def grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        """A Lark grammar (llguidance dialect) accepting exactly one call, or 1..MAX_PARALLEL_CALLS when parallel."""


def _tools_json_lines(tools: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)


def _args_object(arguments: Any) -> Any:
    return _loads(arguments) if isinstance(arguments, str) and _loads(arguments) is not None else arguments


class HermesParser(ToolParser):
    """Whitespace touching a call is not content: text is split around calls and trimmed at the cuts."""

    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)

    def parse(self, text: str, names: set[str]) -> tuple[str | None, list[ParsedCall]]:
        calls: list[ParsedCall] = []
        rest, pos = [], 0
        for m in self._BLOCK.finditer(text):
            call = call_from_object(_loads(m.group(1).strip()), names)
            if call is None:
                continue
            before = text[pos : m.start()].rstrip()
            rest.append(before.lstrip() if calls else before)
            pos = m.end()
            calls.append(call)
        if not calls:
            return text, []
        rest.append(text[pos:].strip())
        return "".join(rest) or None, calls

    def streamer(self, names: set[str], trusted: bool, max_calls: int) -> ToolStreamer:
        return _HermesStreamer(self, names, trusted, max_calls)

    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{_tools_json_lines(tools)}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        return "\n".join(
            f"{self.OPEN}\n"
            + json.dumps({"name": c["name"], "arguments": _args_object(c["arguments"])}, ensure_ascii=False)
            + f"\n{self.CLOSE}"
            for c in calls
        )

    def grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        start = f'start: call ("\\n" call){{0,{MAX_PARALLEL_CALLS - 1}}}' if parallel else "start: call"
        return (
            f"{start}\n"
            'call: "<tool_call>\\n" body "\\n</tool_call>"\n'
            f"body: {lark_json(_call_schema(tools))}\n"
        )


class _HermesStreamer(ToolStreamer):
    _HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:')

    def __init__(self, parser: HermesParser, names: set[str], trusted: bool, max_calls: int) -> None:
        self._parser = parser
        self._names = names
        self._trusted = trusted
        self._max_calls = max_calls
        self._buf = ""
        self._in_call = False
        self._after_call = False  # text right after a call: its leading whitespace is dropped
        self._space = ""  # whitespace held back before an opening tag
        self._header_sent = False
        self._args_start = -1  # where the streamed arguments begin in the buffer; -1 until they start
        self._sent = 0  # characters of the arguments already streamed
        self.calls = 0

    def feed(self, text: str) -> list[StreamEvent]:
        self._buf += text
        out: list[StreamEvent] = []
        open_, close = self._parser.OPEN, self._parser.CLOSE
        while True:
            if not self._in_call:
                if self._after_call:
                    self._buf = self._buf.lstrip()
                    self._after_call = not self._buf
                at = self._buf.find(open_)
                if at == -1:
                    # Hold back a possible start of "<tool_call>" and trailing whitespace (dropped if a call follows).
                    keep = _partial_suffix(self._buf, open_)
                    release = self._buf[: len(self._buf) - keep].rstrip()
                    if release:
                        out.append(release)
                        self._buf = self._buf[len(release) :]
                    return out
                before = self._buf[:at].rstrip()
                if before:
                    out.append(before)
                self._space = self._buf[len(before) : at]  # given back if this turns out not to be a call
                self._buf = self._buf[at + len(open_) :]
                self._in_call, self._header_sent, self._args_start, self._sent = True, False, -1, 0
                continue
            end = self._buf.find(close)
            if self._trusted and self.calls < self._max_calls:
                out += self._stream_arguments(end)
            if end == -1:
                return out
            body, self._buf = self._buf[:end], self._buf[end + len(close) :]
            calls_before = self.calls
            out += self._close(body)
            self._in_call, self._after_call = False, self.calls > calls_before

    def _stream_arguments(self, end: int) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        if not self._header_sent:
            m = self._HEADER.match(self._buf)
            if m is None:
                return out
            self._header_sent = True
            self._header_end = m.end()
            out.append(ToolCallDelta(self.calls, new_call_id(), json.loads(f'"{m.group(1)}"')))
        if self._args_start == -1:
            head = self._buf[self._header_end : None if end == -1 else end]
            if not head.strip():
                return out
            self._args_start = self._header_end + len(head) - len(head.lstrip())
        if end == -1:
            region = self._buf[self._args_start :]
            last = region.rfind("}")
            # The object's own closing brace (and what follows it) may be the end of the call: hold it back.
            safe = last if last != -1 and self._parser.CLOSE.startswith(region[last + 1 :].lstrip()) else len(region)
            if safe > self._sent:
                out.append(ToolCallDelta(self.calls, arguments=region[self._sent : safe]))
                self._sent = safe
        return out

    def _close(self, body: str) -> list[StreamEvent]:
        if self._header_sent:
            args = body[self._args_start :].rstrip() if self._args_start != -1 else ""
            args = args[:-1] if args.endswith("}") else args  # the call object's closing brace
            index, self.calls = self.calls, self.calls + 1
            return [ToolCallDelta(index, arguments=args[self._sent :])] if len(args) > self._sent else []
        call = call_from_object(_loads(body.strip()), self._names)
        if call is None:
            return [self._space + self._parser.OPEN + body + self._parser.CLOSE]
        if self.calls >= self._max_calls:
            return []
        index, self.calls = self.calls, self.calls + 1
        return [ToolCallDelta(index, new_call_id(), call.name), ToolCallDelta(index, arguments=call.arguments)]

    def finish(self) -> list[StreamEvent]:
        rest, self._buf = self._buf, ""
        if not self._in_call:
            rest = rest.rstrip() if self.calls else rest
            return [rest] if rest else []
        if self._header_sent:  # cut off inside a streamed call (max_tokens): send what there is
            args = rest[self._args_start :] if self._args_start != -1 else ""
            return [ToolCallDelta(self.calls, arguments=args[self._sent :])] if len(args) > self._sent else []
        if call_from_object(_loads(rest.strip()), self._names) is not None:  # stopped before its closing tag
            return self._close(rest)
        return [self._space + self._parser.OPEN + rest]


class JsonParser(ToolParser):
    name = "json"
    _FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)

    def parse(self, text: str, names: set[str]) -> tuple[str | None, list[ParsedCall]]:
        stripped = text.strip()
        fenced = self._FENCE.match(stripped)
        data = _loads(fenced.group(1) if fenced else stripped)
        items = data if isinstance(data, list) else [data]
        calls = [call_from_object(item, names) for item in items]
        if not items or any(c is None for c in calls):
            return text, []
        return None, [c for c in calls if c is not None]

    def streamer(self, names: set[str], trusted: bool, max_calls: int) -> ToolStreamer:
        return _JsonStreamer(self, names, max_calls)

    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        return (
            "You have access to the following functions:\n"
            f"{_tools_json_lines(tools)}\n\n"
            "To call a function, respond with only a JSON object of the form "
            '{"name": <function-name>, "arguments": <args-json-object>}, or a JSON list of such objects to call '
            "several. Otherwise answer normally."
        )

    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        objs = [{"name": c["name"], "arguments": _args_object(c["arguments"])} for c in calls]
        return json.dumps(objs[0] if len(objs) == 1 else objs, ensure_ascii=False)

    def grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        schema = _call_schema(tools)
        if parallel:
            schema = {"type": "array", "items": schema, "minItems": 1, "maxItems": MAX_PARALLEL_CALLS}
        return f"start: body\nbody: {lark_json(schema)}\n"


class _JsonStreamer(ToolStreamer):
    """Text that starts like JSON is held to the end and then parsed; anything else streams as content."""

    def __init__(self, parser: JsonParser, names: set[str], max_calls: int) -> None:
        self._parser = parser
        self._names = names
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
        _, calls = self._parser.parse(rest, self._names)
        if not calls:
            return [rest]
        out: list[StreamEvent] = []
        for call in calls[: self._max_calls]:
            out.append(ToolCallDelta(self.calls, new_call_id(), call.name))
            out.append(ToolCallDelta(self.calls, arguments=call.arguments))
            self.calls += 1
        return out


PARSERS: dict[str, ToolParser] = {p.name: p for p in (HermesParser(), JsonParser())}


def content_of(events: Iterable[StreamEvent]) -> str:
    return "".join(e for e in events if isinstance(e, str))
