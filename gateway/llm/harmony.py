"""gpt-oss's harmony messages read apart: the `analysis` channel is reasoning, `final` (and a `commentary` preamble)
is the answer, and a message to `functions.NAME` is a tool call, handed on as a Hermes `<tool_call>` block so the
tool-call stage reads it like any other (whole or streamed).

After the prompt's `<|start|>assistant`, the model writes messages of the form
`<|channel|>CHANNEL[ to=functions.NAME][ <|constrain|>json]<|message|>BODY<|end|>` (the recipient may also come
before `<|channel|>`), the next one after `<|start|>assistant`; the last ends with `<|return|>` or, for a call,
`<|call|>`, which are end-of-sequence tokens and so never reach the text. Every marker is a special token: the
answer is decoded with them kept.
"""

from __future__ import annotations

import json
import re

from gateway.llm.tool_parsers.base import partial_suffix

MESSAGE = "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>(\w+)")


class HarmonyStreamer:
    """Text deltas -> (reasoning, content) pieces; markers cut between deltas are held back until whole."""

    def __init__(self) -> None:
        self._buf = ""
        self._kind: str | None = None  # None while reading a header; "reasoning", "content" or "call" in a body
        self._seen_message = False

    def _open(self, header: str) -> str:
        """The body's kind from its header; a call's opening is written into the content."""
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL.search(header)
        if recipient is not None:
            self._kind = "call"
            return f'<tool_call>\n{{"name": {json.dumps(recipient.group(1))}, "arguments": '
        self._kind = "reasoning" if channel is not None and channel.group(1) == "analysis" else "content"
        return ""

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning = content = ""
        while True:
            if self._kind is None:
                at = self._buf.find(MESSAGE)
                if at == -1:
                    return reasoning, content
                content += self._open(self._buf[:at])
                self._seen_message = True
                self._buf = self._buf[at + len(MESSAGE) :]
                continue
            found = [(self._buf.find(end), end) for end in ENDS if end in self._buf]
            if found:
                at, end = min(found)
                body, self._buf = self._buf[:at], self._buf[at + len(end) :]
            else:
                keep = max(partial_suffix(self._buf, end) for end in ENDS)
                body, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
            if self._kind == "reasoning":
                reasoning += body
            else:
                content += body
            if not found:
                return reasoning, content
            if self._kind == "call":
                content += "}\n</tool_call>\n"
            self._kind = None

    def finish(self) -> tuple[str, str]:
        rest, self._buf = self._buf, ""
        if self._kind is None:  # cut inside a header: nothing of it is text, unless the answer was never harmony
            harmony = self._seen_message or rest.lstrip().startswith(("<|channel|>", "<|start|>", "to="))
            return "", "" if harmony else rest
        kind, self._kind = self._kind, None
        if kind == "reasoning":
            return rest, ""
        return "", rest + ("}\n</tool_call>" if kind == "call" else "")
