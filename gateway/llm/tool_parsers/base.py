"""What every tool-call dialect shares: the parsed call, the streamed delta, the parser and streamer contracts, and
the reading of a call cut short (a forced call stopped by `max_tokens` is still a call, never text)."""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.http.ids import random_hex

MAX_PARALLEL_CALLS = 16


def new_call_id() -> str:
    return f"call_{random_hex()[:24]}"


@dataclass
class ParsedCall:
    name: str
    arguments: str  # JSON text; the start of it for a call cut by the output cap


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
            "index": self.index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


StreamEvent = str | ToolCallDelta  # a str is content text


def content_of(events: Iterable[StreamEvent]) -> str:
    return "".join(e for e in events if isinstance(e, str))


def loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def args_object(arguments: Any) -> Any:
    """Arguments as the object a dialect writes (JSON text that is an object is parsed; anything else kept)."""
    value = loads(arguments) if isinstance(arguments, str) else arguments
    return value if value is not None else arguments


def call_from_object(obj: Any, names: set[str]) -> ParsedCall | None:
    """`{"name": ..., "arguments"|"parameters": {...}}` naming a known tool -> a call; anything else -> None."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args = loads(args)
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker` (text to hold back)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def json_objects(text: str, pos: int = 0, separators: str = "[,;]") -> tuple[list[tuple[Any, str]], int]:
    """The JSON objects written one after another from `pos` (between separators such as a list's brackets and
    commas, or Llama 3's semicolons), each with its text, and where the first one that does not parse begins."""
    decoder = json.JSONDecoder()
    found: list[tuple[Any, str]] = []
    while True:
        while pos < len(text) and (text[pos].isspace() or text[pos] in separators):
            pos += 1
        if pos >= len(text) or text[pos] != "{":
            return found, pos
        try:
            obj, end = decoder.raw_decode(text, pos)
        except ValueError:
            return found, pos
        found.append((obj, text[pos:end]))
        pos = end


def close_outside_strings(text: str, marker: str, pos: int = 0) -> int:
    """Where `marker` first occurs in `text` from `pos` outside a JSON string literal, or -1 (a call's closing tag
    written inside an argument's value is part of the value, not the end of the call)."""
    return CloseOutsideStrings(marker, pos).find(text)


class CloseOutsideStrings:
    """`close_outside_strings` over a text that only grows (a streamed call's buffer): each `find` goes on from
    where the last one stopped, with the JSON string and escape state it had there, so a call of n characters fed
    in any number of pieces is scanned in O(n) in all, not O(n) a piece."""

    def __init__(self, marker: str, pos: int = 0) -> None:
        self.marker = marker
        self.pos = pos  # the first character not yet scanned past (the marker's, once found)
        self.in_string = self.escaped = False
        self.examined = 0  # characters looked at over every `find`, looked at again included: the work done

    def find(self, text: str) -> int:
        """Where the marker is in `text` (the text of the last call, perhaps with more appended), or -1 yet."""
        marker, n = self.marker, len(text)
        i = start = self.pos
        in_string, escaped, found = self.in_string, self.escaped, -1
        while i < n:
            ch = text[i]
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif text.startswith(marker, i):
                found = i
                break
            elif n - i < len(marker) and marker.startswith(text[i:]):
                break  # the marker may begin here: this character is looked at again when more text has come
            i += 1
        self.examined += i - start + (i < n)
        self.pos, self.in_string, self.escaped = i, in_string, escaped
        return found


def resolve_name(prefix: str, names: set[str], complete: bool) -> str | None:
    """The tool a cut call names: the name itself, or the only tool whose name starts with what was written."""
    if complete:
        return prefix if prefix in names else None
    matches = [n for n in names if n.startswith(prefix)]
    return matches[0] if len(matches) == 1 else None


_NAME_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)(")?')
_ARGS_HEAD = re.compile(r'\s*,\s*"(?:arguments|parameters)"\s*:\s*')


def partial_object_call(text: str, names: set[str]) -> ParsedCall | None:
    """A call object cut short (`{"name": "get_wea`, `{"name": "f", "arguments": {"city": "Pa`): the tool it names
    (or the only one its name's start fits) and the start of its arguments; None if no tool can be told."""
    m = _NAME_HEAD.match(text)
    if m is None:  # cut before the name: only a single candidate can be told
        name = resolve_name("", names, False)
        return ParsedCall(name, "") if name is not None else None
    closed = m.group(2) is not None
    name = resolve_name(_unescaped(m.group(1)), names, closed)
    if name is None:
        return None
    a = _ARGS_HEAD.match(text, m.end())
    return ParsedCall(name, text[a.end() :] if a else "")


def _unescaped(raw: str) -> str:
    """A JSON string's text, possibly cut inside an escape (which is then dropped)."""
    value = loads(f'"{raw}"')
    if value is None:
        value = loads(f'"{raw[: raw.rfind(chr(92))]}"')
    return value if isinstance(value, str) else ""


def call_schema(tools: list[dict[str, Any]], args_key: str = "arguments") -> dict[str, Any]:
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                args_key: t["function"].get("parameters") or {"type": "object", "properties": {}},
            },
            "required": ["name", args_key],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def tools_json_lines(tools: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)


class ToolStreamer(ABC):
    """Turns a choice's text deltas into content and tool-call deltas."""

    calls: int = 0

    @abstractmethod
    def feed(self, text: str) -> list[StreamEvent]: ...

    @abstractmethod
    def finish(self) -> list[StreamEvent]:
        """The rest at the end of the answer; a forced (trusted) call cut short comes out as a call."""


class ToolParser(ABC):
    """One model family's way of writing tool calls (`parameters.tool_parser`, or chosen from the template)."""

    name: str
    # Markers that are special tokens of the family's vocabulary must stay in the decoded text to be read.
    needs_special_tokens: bool = False

    @abstractmethod
    def parse(self, text: str, names: set[str]) -> tuple[str | None, list[ParsedCall]]:
        """Split a finished answer into content (None if nothing but calls) and calls."""

    @abstractmethod
    def parse_forced(self, text: str, names: set[str]) -> list[ParsedCall]:
        """The calls of an answer constrained by `grammar` (tool_choice required / named); a call cut by the
        output cap is returned with the arguments written so far."""

    @abstractmethod
    def streamer(self, names: set[str], trusted: bool, max_calls: int) -> ToolStreamer:
        """`trusted`: output is grammar-constrained to this dialect, so arguments may be streamed as they come and a
        call cut short is still a call."""

    @abstractmethod
    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        """The tools described for a chat template that ignores `tools`, in this dialect."""

    @abstractmethod
    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        """Past calls (`{"name", "arguments": dict|str}`) as the model would have written them."""

    @abstractmethod
    def grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        """A Lark grammar (llguidance dialect) accepting exactly one call, or 1..MAX_PARALLEL_CALLS when parallel."""

    def render_result(self, content: str) -> str:
        """A tool's result as text in a user turn, for templates without a `tool` role (Hermes' convention)."""
        return f"<tool_response>\n{content}\n</tool_response>"

    def template_call_id(self, call_id: str) -> str:
        """A call id as the family's template accepts it in the history (Mistral's must be 9 characters)."""
        return call_id
