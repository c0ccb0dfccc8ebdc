"""Dialects whose calls run from a start marker to the end of the answer (Llama 3, Mistral, Phi-4-mini, plain
JSON): text before the marker is content, everything after it is calls. A call region that does not read as calls
of known tools is given back as content, whole (as vLLM does)."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from gateway.llm.grammar_compiler import lark_json
from gateway.llm.tool_parsers.base import (
    MAX_PARALLEL_CALLS,
    ParsedCall,
    StreamEvent,
    ToolCallDelta,
    ToolParser,
    ToolStreamer,
    call_from_object,
    call_schema,
    new_call_id,
    partial_object_call,
    partial_suffix,
)


class RegionParser(ToolParser):
    markers: tuple[str, ...] = ()  # any of these opens the calls (and is not part of them)
    bare_start: str | None = None  # the calls may also begin with this character, which is part of them
    at_start_only = False  # calls only when the answer begins with them (Llama 3)

    @abstractmethod
    def read_calls(self, region: str) -> tuple[list[Any], int]:
        """The whole call objects (`{"name", "arguments"}`) the region holds, and where the unread rest begins."""

    def partial_call(self, tail: str, names: set[str]) -> ParsedCall | None:
        """The call the unread rest of a forced answer begins, cut by the output cap."""
        return partial_object_call(tail, names)

    def start(self, text: str, final: bool) -> tuple[int, int] | int | None:
        """(where the calls begin, marker length); or, while streaming, an int: how many trailing characters to hold
        back because they may begin a marker; None when `text` has no calls and never will."""
        if self.at_start_only:
            at = len(text) - len(text.lstrip())
            head = text[at:]
            for marker in self.markers:
                if head.startswith(marker):
                    return at, len(marker)
            if self.bare_start is not None and head.startswith(self.bare_start):
                return at, 0
            if not head or (not final and any(m.startswith(head) for m in self.markers)):
                return len(text) if not final else None
            return None
        found = [(text.find(m), len(m)) for m in self.markers if m in text]
        if found:
            return min(found)
        return None if final else max((partial_suffix(text, m) for m in self.markers), default=0)

    def parse(self, text: str, names: set[str]) -> tuple[str | None, list[ParsedCall]]:
        at = self.start(text, True)
        if not isinstance(at, tuple):
            return text, []
        region = text[at[0] + at[1] :]
        objects, end = self.read_calls(region)
        calls = [call_from_object(obj, names) for obj in objects]
        if not calls or any(c is None for c in calls) or region[end:].strip():
            return text, []
        return text[: at[0]].rstrip() or None, [c for c in calls if c is not None]

    def parse_forced(self, text: str, names: set[str]) -> list[ParsedCall]:
        at = self.start(text, True)
        region = text[at[0] + at[1] :] if isinstance(at, tuple) else text
        objects, end = self.read_calls(region)
        calls = [c for c in (call_from_object(obj, names) for obj in objects) if c is not None]
        if region[end:].strip() or not calls:
            cut = self.partial_call(region[end:], names)
            calls += [cut] if cut is not None else []
        return calls

    def streamer(self, names: set[str], trusted: bool, max_calls: int) -> ToolStreamer:
        return _RegionStreamer(self, names, trusted, max_calls)

    def list_grammar(self, tools: list[dict[str, Any]], parallel: bool, args_key: str = "arguments") -> str:
        items = {
            "type": "array",
            "items": call_schema(tools, args_key),
            "minItems": 1,
            "maxItems": MAX_PARALLEL_CALLS if parallel else 1,
        }
        return f"start: body\nbody: {lark_json(items)}\n"


class _RegionStreamer(ToolStreamer):
    """Content streams until a call marker; the calls are held. A forced (trusted) answer's calls go out as each one
    is whole, and one cut short at the end still goes out as a call; others are read when the answer ends."""

    def __init__(self, parser: RegionParser, names: set[str], trusted: bool, max_calls: int) -> None:
        self._parser = parser
        self._names = names
        self._trusted = trusted
        self._max_calls = max_calls
        self._buf = ""
        self._region: str | None = None  # the text from the marker on, once one was seen
        self._marker = 0
        self._passing = False  # no calls can follow: text streams as it comes
        self._sent_objects = 0  # whole call objects of the region already sent (trusted)
        self.calls = 0

    def feed(self, text: str) -> list[StreamEvent]:
        if self._passing:
            return [text] if text else []
        if self._region is not None:
            self._region += text
            return self._whole_calls() if self._trusted else []
        self._buf += text
        if self._trusted:  # the grammar allows nothing but calls
            self._region, self._marker, self._buf = self._buf, 0, ""
            return self._whole_calls()
        at = self._parser.start(self._buf, False)
        if at is None:
            self._passing = True
            out, self._buf = self._buf, ""
            return [out] if out else []
        if isinstance(at, int):  # hold a possible start of a marker, and the whitespace a marker would drop
            release = self._buf[: len(self._buf) - at].rstrip()
            self._buf = self._buf[len(release) :]
            return [release] if release else []
        before = self._buf[: at[0]].rstrip()
        self._region, self._marker, self._buf = self._buf[len(before) :], at[0] - len(before) + at[1], ""
        return [before] if before else []

    def _emit(self, call: ParsedCall) -> list[StreamEvent]:
        if self.calls >= self._max_calls:
            return []
        index, self.calls = self.calls, self.calls + 1
        out: list[StreamEvent] = [ToolCallDelta(index, new_call_id(), call.name)]
        return out + [ToolCallDelta(index, arguments=call.arguments)] if call.arguments else out

    def _calls_text(self) -> str:
        """The region without its marker (a forced answer has none, but reads the same with one)."""
        assert self._region is not None
        region = self._region[self._marker :]
        at = self._parser.start(region, True) if self._trusted else None
        return region[at[0] + at[1] :] if isinstance(at, tuple) else region

    def _whole_calls(self) -> list[StreamEvent]:
        objects, _ = self._parser.read_calls(self._calls_text())
        out: list[StreamEvent] = []
        for obj in objects[self._sent_objects :]:
            call = call_from_object(obj, self._names)
            out += self._emit(call) if call is not None else []
        self._sent_objects = len(objects)
        return out

    def finish(self) -> list[StreamEvent]:
        if self._region is None:
            rest, self._buf = self._buf, ""
            return [rest] if rest else []
        if self._trusted:
            out = self._whole_calls()
            region = self._calls_text()
            _, end = self._parser.read_calls(region)
            if region[end:].strip() or not self.calls:
                cut = self._parser.partial_call(region[end:], self._names)
                out += self._emit(cut) if cut is not None else []
            return out
        content, calls = self._parser.parse(self._region, self._names)
        if not calls:
            return [self._region]
        out = [content] if content else []
        for call in calls:
            out += self._emit(call)
        return out
