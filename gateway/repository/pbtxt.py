"""Reader for Triton's ``config.pbtxt`` (protobuf text format of ``ModelConfig``) into plain dicts.

Written by hand so the gateway can read Triton model repositories without protobuf or
Triton's generated code; the result is mapped onto the gateway's own typed config elsewhere.

Supported subset of the text format:

- fields ``name: scalar``; messages ``name { ... }``, ``name: { ... }`` and ``name < ... >``;
- scalars: integers (decimal, ``0x`` hex, leading-zero octal, optional sign), floats
  (``1.5``, ``.5``, ``1e-3``, ``2.0f``, ``inf``, ``-infinity``, ``nan``), single- or double-quoted
  strings with C escapes (``\\n \\t \\" \\' \\\\ \\x41 \\101 \\u00e9 \\U0001F600``; adjacent
  strings concatenate), ``true``/``false`` (also ``True``/``False``), and enum identifiers such
  as ``TYPE_FP32`` or ``KIND_CPU``, kept as strings;
- repeated fields: the same key again, or list syntax ``key: [1, 2]`` / ``key [ {...}, {...} ]``
  (trailing comma allowed);
- ``#`` comments, and an optional ``,`` or ``;`` after any field.

Not supported (rejected with an error): extension / ``Any`` field names in brackets, and anything
that needs the schema to interpret (the parser never checks field names or value types).

Result shape: one insertion-ordered dict per message. A key written once holds its value; a key
written several times, or with list syntax, holds a list. Because the schema is not consulted,
names in :data:`KNOWN_REPEATED` (Triton's repeated fields) are always lists, and names in
:data:`KNOWN_MAPS` (Triton's map fields, written as ``{ key: ... value: ... }`` entries) become
``{key: value}`` dicts. The lookup is by field name only, so the rare map ``graph_spec.input`` of
the CUDA optimisation settings comes out as a list of ``{"key", "value"}`` entries. Use
:func:`as_list` for any other field that may appear once or many times.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Any, Collection, Iterator

#: Triton ModelConfig repeated fields (by name, across all nested messages).
KNOWN_REPEATED: frozenset[str] = frozenset(
    {
        "input",
        "output",
        "dims",
        "shape",
        "dim",
        "batch_input",
        "batch_output",
        "instance_group",
        "model_warmup",
        "gpus",
        "secondary_devices",
        "profile",
        "versions",
        "preferred_batch_size",
        "control_input",
        "control",
        "int32_false_true",
        "fp32_false_true",
        "bool_false_true",
        "state",
        "initial_state",
        "step",
        "source_input",
        "gpu_execution_accelerator",
        "cpu_execution_accelerator",
        "graph_spec",
        "agents",
        "op_library_filename",
        "resources",
    }
)
#: Triton ModelConfig map fields: their ``{key, value}`` entries are folded into one dict.
KNOWN_MAPS: frozenset[str] = frozenset(
    {"parameters", "input_map", "output_map", "inputs", "cc_model_filenames", "metric_tags", "priority_queue_policy"}
)

_MAX_DEPTH = 64
_MAX_NUMBER = 1000  # characters of a number literal (a uint64 takes 20; Python converts no decimal of 4300 digits)
_TOKEN = re.compile(
    r"""
    (?P<skip>[ \t\r\n\f\v]+|\#[^\n]*)
  | (?P<number>(?:0[xX][0-9a-fA-F]+|(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?[fF]?)(?![\w.]))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<punct>[{}\[\]<>:,;+-])
  | (?P<badnumber>[0-9.][\w.]*)
  | (?P<badstring>["'])
    """,
    re.VERBOSE,
)
_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))", re.DOTALL)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
_SIMPLE_ESCAPES.update({c: c for c in "\\'\"?"})
_FLOAT_WORDS = {"inf": float("inf"), "infinity": float("inf"), "nan": float("nan")}
_BOOLS = {"true": True, "True": True, "false": False, "False": False}
_CLOSERS = {"{": "}", "<": ">"}


class PbtxtError(ValueError):
    """A config.pbtxt that cannot be parsed; ``line`` and ``column`` are 1-based."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(f"line {line}, column {column}: {message}")
        self.message, self.line, self.column = message, line, column


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    pos: int


def as_list(value: Any) -> list[Any]:
    """Normalise a field that may be absent, given once, or repeated into a list."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def parse_pbtxt(
    text: str | bytes, *, repeated: Collection[str] = KNOWN_REPEATED, maps: Collection[str] = KNOWN_MAPS
) -> dict[str, Any]:
    """Parse protobuf text format into dicts; pass empty ``repeated``/``maps`` for the schema-free view."""
    if isinstance(text, (bytes, bytearray)):
        raw = bytes(text)
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
            raise PbtxtError("file is not valid UTF-8", line, column) from None
    return _Parser(text, repeated, maps).parse()


class _Parser:
    """Recursive descent over a lazy token stream; one instance per document."""

    def __init__(self, text: str, repeated: Collection[str], maps: Collection[str]) -> None:
        self.text, self.repeated, self.maps = text, repeated, maps
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.tokens = self._tokenize()  # lazy, so errors surface in document order
        self.ahead: _Token | None = None

    # -------------------------------------------------------------- plumbing

    def error(self, message: str, token: _Token | None = None) -> PbtxtError:
        pos = len(self.text) if token is None else token.pos
        line = bisect.bisect_right(self.line_starts, pos)
        return PbtxtError(message, line, pos - self.line_starts[line - 1] + 1)

    def _tokenize(self) -> Iterator[_Token]:
        pos = 0
        while pos < len(self.text):
            match = _TOKEN.match(self.text, pos)
            if match is None:
                raise self.error(f"unexpected character {self.text[pos]!r}", _Token("", "", pos))
            kind = match.lastgroup or ""
            token = _Token(kind, match.group(), pos)
            if kind == "badnumber":
                raise self.error(f"invalid number {token.text[:40]!r}", token)
            if kind == "badstring":
                raise self.error("unterminated string", token)
            if kind != "skip":
                yield token
            pos = match.end()

    def peek(self) -> _Token | None:
        if self.ahead is None:
            self.ahead = next(self.tokens, None)
        return self.ahead

    def take(self, what: str) -> _Token:
        token = self.peek()
        if token is None:
            raise self.error(f"expected {what}, got end of input")
        self.ahead = None
        return token

    def skip(self) -> None:
        """Consume the token just peeked at."""
        self.ahead = None

    def at(self, *puncts: str) -> bool:
        token = self.peek()
        return token is not None and token.kind == "punct" and token.text in puncts

    # -------------------------------------------------------------- grammar

    def parse(self) -> dict[str, Any]:
        return self.message(None, None, 0)

    def message(self, opener: _Token | None, close: str | None, depth: int) -> dict[str, Any]:
        if depth > _MAX_DEPTH:
            raise self.error("messages are nested too deeply", opener)
        fields: dict[str, Any] = {}
        lists: set[str] = set()
        while True:
            token = self.peek()
            if token is None:
                if close is None or opener is None:
                    return fields
                raise self.error(f"missing {close!r} to close the {opener.text!r} here", opener)
            self.skip()
            if token.kind == "punct" and token.text == close:
                return fields
            if token.kind != "ident":
                if token.kind == "punct" and token.text == "[":
                    raise self.error("extension and Any field names are not supported", token)
                expected = f"; expected {close!r}" if close and token.text in ("}", ">") else ""
                raise self.error(f"expected a field name, got {token.text[:40]!r}{expected}", token)
            value, is_list = self.field_value(token, depth)
            self.store(fields, lists, token, value, is_list)
            if self.at(",", ";"):
                self.skip()

    def field_value(self, name: _Token, depth: int) -> tuple[Any, bool]:
        colon = self.at(":")
        if colon:
            self.skip()
        if self.at("{", "<"):
            opener = self.take("'{'")
            return self.message(opener, _CLOSERS[opener.text], depth + 1), False
        if self.at("["):
            return self.list_value(self.take("'['"), depth), True
        if not colon:
            raise self.error(f"expected ':' or '{{' after field {name.text!r}", self.peek())
        return self.scalar(), False

    def list_value(self, opener: _Token, depth: int) -> list[Any]:
        items: list[Any] = []
        while not self.at("]"):
            if self.at("{", "<"):
                brace = self.take("'{'")
                items.append(self.message(brace, _CLOSERS[brace.text], depth + 1))
            else:
                items.append(self.scalar())
            if self.peek() is None:
                raise self.error("missing ']' to close the '[' here", opener)
            if not self.at(",", "]"):
                raise self.error("expected ',' or ']' in list", self.peek())
            if self.at(","):
                self.skip()
        self.skip()
        return items

    def scalar(self) -> Any:
        token = self.take("a value")
        sign = ""
        if token.kind == "punct" and token.text in "+-":
            sign, token = token.text, self.take("a number after the sign")
            if token.kind not in ("number", "ident") or (
                token.kind == "ident" and token.text.lower() not in _FLOAT_WORDS
            ):
                raise self.error(f"expected a number after {sign!r}", token)
        if token.kind == "number":
            return self.number(sign + token.text, token)
        if token.kind == "ident":
            word = token.text.lower()
            if word in _FLOAT_WORDS:
                return -_FLOAT_WORDS[word] if sign == "-" else _FLOAT_WORDS[word]
            return _BOOLS.get(token.text, token.text)
        if token.kind == "string":
            parts = [self.string(token)]
            while (nxt := self.peek()) is not None and nxt.kind == "string":
                parts.append(self.string(self.take("a string")))
            return "".join(parts)
        raise self.error(f"expected a value, got {token.text!r}", token)

    def number(self, text: str, token: _Token) -> int | float:
        if len(text) > _MAX_NUMBER:  # Python converts no decimal of more than 4300 digits (a ValueError)
            raise self.error(f"number too long ({len(text)} characters)", token)
        digits = text.lstrip("+-")
        negative = text.startswith("-")
        if digits[:2] in ("0x", "0X"):
            value: int | float = int(digits, 16)
        elif any(c in digits for c in ".eEfF"):
            value = float(digits.rstrip("fF"))
        elif len(digits) > 1 and digits.startswith("0"):
            if not digits.isdigit() or "8" in digits or "9" in digits:
                raise self.error(f"invalid octal number {token.text!r}", token)
            value = int(digits, 8)
        else:
            value = int(digits)
        return -value if negative else value

    def string(self, token: _Token) -> str:
        body = token.text[1:-1]
        out = bytearray()
        pos = 0
        for match in _ESCAPE.finditer(body):
            out += body[pos : match.start()].encode("utf-8")
            octal, hex2, u4, u8, simple = match.groups()
            if octal is not None:
                out.append(int(octal, 8) & 0xFF)
            elif hex2 is not None:
                out.append(int(hex2, 16))
            elif u4 is not None or u8 is not None:
                code = int(u4 or u8, 16)
                if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                    raise self.error("invalid unicode escape", _Token("string", "", token.pos + 1 + match.start()))
                out += chr(code).encode("utf-8")
            elif simple in _SIMPLE_ESCAPES:
                out += _SIMPLE_ESCAPES[simple].encode()
            else:
                raise self.error(f"unknown escape '\\{simple}'", _Token("string", "", token.pos + 1 + match.start()))
            pos = match.end()
        out += body[pos:].encode("utf-8")
        try:
            return out.decode("utf-8")
        except UnicodeDecodeError:
            raise self.error("string escapes do not form valid UTF-8", token) from None

    # -------------------------------------------------------------- building the result

    def store(self, fields: dict[str, Any], lists: set[str], name: _Token, value: Any, is_list: bool) -> None:
        key = name.text
        if key in self.maps:
            target = fields.setdefault(key, {})
            for entry in value if is_list else [value]:
                if not isinstance(entry, dict) or "key" not in entry or "value" not in entry:
                    raise self.error(f"map field {key!r} needs entries of the form {{ key: ... value: ... }}", name)
                if isinstance(entry["key"], (dict, list)):
                    raise self.error(f"map field {key!r} has a key that is not a scalar", name)
                target[entry["key"]] = entry["value"]
            return
        if is_list or key in fields or key in self.repeated:
            if key not in lists:
                fields[key] = [fields[key]] if key in fields else []
                lists.add(key)
            fields[key].extend(value if is_list else [value])
        else:
            fields[key] = value
