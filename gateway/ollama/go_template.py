"""The `template` of /api/generate: the part of Go's text/template that Ollama's prompt templates use.

Ollama's templates are Go templates over `.System`, `.Prompt` and `.Response` (the answer, empty while prompting),
e.g. `{{ if .System }}<|im_start|>system\\n{{ .System }}<|im_end|>\\n{{ end }}<|im_start|>user\\n{{ .Prompt }}...`.
Read here: those fields, `{{ if .X }} ... {{ else if .Y }} ... {{ else }} ... {{ end }}` (nested), comments, and the
`{{-` / `-}}` whitespace trims. Anything else (`range .Messages`, functions, pipelines) is refused with a 400 that
names it: a template that renders differently from Ollama's would silently change the prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gateway.errors import InvalidRequestError

FIELDS = ("System", "Prompt", "Response")
MAX_TEMPLATE_CHARS = 64 * 1024
_ACTION = re.compile(r"\{\{(-?)(.*?)(-?)\}\}", re.S)
_FIELD = re.compile(r"\.(\w+)")


@dataclass
class _Branch:
    condition: str | None  # a field name; None for `else`
    body: list[_Node] = field(default_factory=list)


@dataclass
class _If:
    branches: list[_Branch]


@dataclass(frozen=True)
class _Field:
    name: str


_Node = str | _Field | _If  # text, a field's value, or a conditional


def _fail(action: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"template: '{{{{{action[:60]}}}}}' is not supported here; a template may use {{{{ .System }}}}, "
        "{{ .Prompt }}, {{ .Response }}, {{ if .X }} / {{ else }} / {{ end }} and comments",
        param="template",
    )


def _field(expr: str, action: str) -> str:
    match = _FIELD.fullmatch(expr)
    if match is None or match.group(1) not in FIELDS:
        raise _fail(action)
    return match.group(1)


def _parse(source: str) -> list[_Node]:
    root: list[_Node] = []
    stack: list[tuple[_If, list[_Node]]] = []  # open conditionals and the body they were opened in
    body = root
    pos = 0
    trim_next = False
    for match in _ACTION.finditer(source):
        text = source[pos : match.start()]
        if trim_next:
            text = text.lstrip()
        if match.group(1):
            text = text.rstrip()
        if text:
            body.append(text)
        pos, trim_next = match.end(), bool(match.group(3))
        action = match.group(2).strip()
        if action.startswith("/*") and action.endswith("*/"):
            continue
        words = action.split(None, 1)
        head = words[0] if words else ""
        if head == "if" and len(words) == 2:
            node = _If([_Branch(_field(words[1].strip(), action))])
            body.append(node)
            stack.append((node, body))
            body = node.branches[-1].body
        elif head == "else" and stack:
            cond, rest = None, words[1].strip() if len(words) == 2 else ""
            if rest:
                if not rest.startswith("if "):
                    raise _fail(action)
                cond = _field(rest[3:].strip(), action)
            current = stack[-1][0]
            if current.branches[-1].condition is None:
                raise _fail(action)  # nothing may follow a plain else
            current.branches.append(_Branch(cond))
            body = current.branches[-1].body
        elif head == "end" and len(words) == 1 and stack:
            _, body = stack.pop()
        else:
            body.append(_Field(_field(action, action)))
    if stack:
        raise InvalidRequestError("template: an {{ if }} has no {{ end }}", param="template")
    text = source[pos:]
    if trim_next:
        text = text.lstrip()
    if text:
        body.append(text)
    return root


def _render(nodes: list[_Node], values: dict[str, str], out: list[str]) -> None:
    for node in nodes:
        if isinstance(node, _If):
            branch = next((b for b in node.branches if b.condition is None or values[b.condition]), None)
            if branch is not None:
                _render(branch.body, values, out)
        elif isinstance(node, _Field):
            out.append(values[node.name])
        else:
            out.append(node)


def render_template(source: str, system: str, prompt: str) -> str:
    """The prompt `source` makes of the system prompt and the user's prompt (400 for what is not read here)."""
    if len(source) > MAX_TEMPLATE_CHARS:
        raise InvalidRequestError(f"template: at most {MAX_TEMPLATE_CHARS} characters", param="template")
    out: list[str] = []
    _render(_parse(source), {"System": system, "Prompt": prompt, "Response": ""}, out)
    return "".join(out)
