"""Hermes / Qwen 2.5 / Qwen 3 calls: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, several in a
row for parallel calls (Hermes, Qwen 2.5/3 and many fine-tunes write them so; it is also the dialect the tools are
described in for templates that ignore `tools`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from gateway.llm.grammar_compiler import lark_json
from gateway.llm.tool_parsers.base import (
    MAX_PARALLEL_CALLS,
    CloseOutsideStrings,
    ParsedCall,
    StreamEvent,
    ToolCallDelta,
    ToolParser,
    ToolStreamer,
    args_object,
    call_from_object,
    call_schema,
    close_outside_strings,
    json_objects,
    loads,
    new_call_id,
    partial_object_call,
    partial_suffix,
    tools_json_lines,
)


class HermesParser(ToolParser):
    """Whitespace touching a call is not content: text is split around calls and trimmed at the cuts."""

    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def blocks(self, text: str) -> Iterator[tuple[int, str, int]]:
        """Each `<tool_call>` block: where it starts, its body, and where it ends (the text's end if unclosed).

        The closing tag is looked for outside JSON strings only: an argument may itself contain "</tool_call>"
        (grammar-forced calls allow any string), and a cut there would leave arguments that are not JSON.
        """
        pos = 0
        while (at := text.find(self.OPEN, pos)) != -1:
            body = at + len(self.OPEN)
            end = close_outside_strings(text, self.CLOSE, body)
            if end == -1:
                yield at, text[body:], len(text)
                return
            yield at, text[body:end], end + len(self.CLOSE)
            pos = end + len(self.CLOSE)

    def parse(self, text: str, names: set[str]) -> tuple[str | None, list[ParsedCall]]:
        calls: list[ParsedCall] = []
        rest, pos = [], 0
        for start, body, end in self.blocks(text):
            call = call_from_object(loads(body.strip()), names)
            if call is None:
                continue
            before = text[pos:start].rstrip()
            rest.append(before.lstrip() if calls else before)
            pos = end
            calls.append(call)
        if not calls:
            return text, []
        rest.append(text[pos:].strip())
        return "".join(rest) or None, calls

    def parse_forced(self, text: str, names: set[str]) -> list[ParsedCall]:
        calls = []
        for _, body, _ in self.blocks(text):
            found, rest = json_objects(body, separators="")
            call = call_from_object(found[0][0], names) if found else partial_object_call(body[rest:], names)
            if call is not None:
                calls.append(call)
        if not calls and self.OPEN.startswith(text.strip()):  # cut inside the opening tag
            call = partial_object_call("", names)
            calls = [call] if call is not None else []
        return calls

    def streamer(self, names: set[str], trusted: bool, max_calls: int) -> ToolStreamer:
        return _HermesStreamer(self, names, trusted, max_calls)

    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{tools_json_lines(tools)}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        return "\n".join(
            f"{self.OPEN}\n"
            + json.dumps({"name": c["name"], "arguments": args_object(c["arguments"])}, ensure_ascii=False)
            + f"\n{self.CLOSE}"
            for c in calls
        )

    def grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        start = f'start: call ("\\n" call){{0,{MAX_PARALLEL_CALLS - 1}}}' if parallel else "start: call"
        return f'{start}\ncall: "<tool_call>\\n" body "\\n</tool_call>"\nbody: {lark_json(call_schema(tools))}\n'


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
        self._close_scan = CloseOutsideStrings(parser.CLOSE)  # the open call's closing tag, looked for as text comes
        self._args_end = _ArgumentsEnd(parser.CLOSE)  # both made anew for each call
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
                    keep = partial_suffix(self._buf, open_)
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
                self._close_scan, self._args_end = CloseOutsideStrings(close), _ArgumentsEnd(close)
                continue
            end = self._close_scan.find(self._buf)
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
            safe = self._args_end.sendable(self._buf, self._args_start) - self._args_start
            if safe > self._sent:
                start = self._args_start
                out.append(ToolCallDelta(self.calls, arguments=self._buf[start + self._sent : start + safe]))
                self._sent = safe
        return out

    def _close(self, body: str) -> list[StreamEvent]:
        if self._header_sent:
            args = body[self._args_start :].rstrip() if self._args_start != -1 else ""
            args = args[:-1] if args.endswith("}") else args  # the call object's closing brace
            index, self.calls = self.calls, self.calls + 1
            return [ToolCallDelta(index, arguments=args[self._sent :])] if len(args) > self._sent else []
        call = call_from_object(loads(body.strip()), self._names)
        if call is None:
            return [self._space + self._parser.OPEN + body + self._parser.CLOSE]
        if self.calls >= self._max_calls:
            return []
        index, self.calls = self.calls, self.calls + 1
        return [ToolCallDelta(index, new_call_id(), call.name), ToolCallDelta(index, arguments=call.arguments)]

    def finish(self) -> list[StreamEvent]:
        rest, self._buf = self._buf, ""
        if not self._in_call:
            if self._trusted:  # a forced answer cut inside "<tool_call>" (or after its last call): no text
                return self._cut_call("") if not self.calls and rest.strip() else []
            rest = rest.rstrip() if self.calls else rest
            return [rest] if rest else []
        if self._header_sent:  # cut off inside a streamed call (max_tokens): send what there is
            args = rest[self._args_start :] if self._args_start != -1 else ""
            whole, _ = json_objects(args, separators="")
            args = whole[0][1] if whole else args  # the arguments ended, their call or its tag did not
            self.calls += 1
            return [ToolCallDelta(self.calls - 1, arguments=args[self._sent :])] if len(args) > self._sent else []
        if call_from_object(loads(rest.strip()), self._names) is not None:  # stopped before its closing tag
            return self._close(rest)
        if self._trusted:
            return self._cut_call(rest) if self.calls < self._max_calls else []
        return [self._space + self._parser.OPEN + rest]

    def _cut_call(self, body: str) -> list[StreamEvent]:
        """A forced call cut before its name was whole: the tool it can only be, with what its arguments began."""
        call = partial_object_call(body, self._names)
        if call is None:
            return []
        index, self.calls = self.calls, self.calls + 1
        out: list[StreamEvent] = [ToolCallDelta(index, new_call_id(), call.name)]
        return out + [ToolCallDelta(index, arguments=call.arguments)] if call.arguments else out


class _ArgumentsEnd:
    """How far a streamed call's arguments may be sent while its closing tag has not come: up to the last "}" when
    only whitespace and a start of the tag follow it (the object's own closing brace, which may end the call: held
    back until the next text shows it does not), else all of them. Each call looks at the text added since the last
    one only (the last brace and the first character after it that is not whitespace are remembered), so a long
    call streamed in small pieces costs its length, not its length a piece."""

    def __init__(self, close: str) -> None:
        self._close = close
        self._seen = 0  # the buffer's length at the last call
        self._brace = -1  # the last "}" at or after the arguments' start
        self._after = -1  # the first character after it that is not whitespace; -1: none yet

    def sendable(self, buf: str, args_start: int) -> int:
        """The end (an index in `buf`, which only grows between calls) of the arguments that may be sent."""
        new = max(self._seen, args_start)
        self._seen = len(buf)
        brace = buf.rfind("}", new)
        if brace != -1:
            self._brace, self._after, new = brace, -1, brace + 1
        if self._brace == -1:
            return len(buf)
        if self._after == -1:
            self._after = next((i for i in range(new, len(buf)) if not buf[i].isspace()), -1)
            if self._after == -1:
                return self._brace  # only whitespace after it yet
        held = len(buf) - self._after <= len(self._close) and self._close.startswith(buf[self._after :])
        return self._brace if held else len(buf)
