"""Reasoning read apart from the answer, as vLLM's `--reasoning-parser` does: `<think>...</think>` (Qwen 3, QwQ,
DeepSeek-R1 and its distills) or gpt-oss's `analysis` channel (harmony.py) becomes the message's `reasoning_content`
(and vLLM's newer `reasoning`), the rest its `content`.

A parser is chosen per model, once when it loads (gateway/llm/parsers.py), with `parameters.reasoning_parser`:
`auto` (the default: `openai_gptoss` when the chat template writes harmony's `<|channel|>`, `qwen3` when it writes
`<think>`, else none), `none`, `qwen3`, `deepseek_r1` or `openai_gptoss`. Whether the answer starts inside the
reasoning is read from the prompt: DeepSeek-R1's template (and Qwen3's thinking-only ones) end the prompt with an
open `<think>`, and the model then writes only the closing tag. `deepseek_r1` assumes that always, as vLLM's does. An
answer cut before its `</think>` is all reasoning.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

from engines.interface import Tokenizer
from gateway.errors import InternalError
from gateway.llm.harmony import HarmonyStreamer
from gateway.llm.tool_parsers.base import partial_suffix

OPEN, CLOSE = "<think>", "</think>"
AUTO, NONE = "auto", "none"


@dataclass(frozen=True)
class Split:
    reasoning: str | None
    content: str


class PieceStreamer(Protocol):
    def feed(self, text: str) -> tuple[str, str]:
        """The reasoning text and the content text this delta releases."""

    def finish(self) -> tuple[str, str]: ...


class ReasoningParser(ABC):
    name: str
    needs_special_tokens = False  # its markers are special tokens, kept in the decoded text

    def starts_open(self, prompt_tail: str) -> bool:
        """Whether the answer begins inside the reasoning (the prompt's last characters opened it)."""
        return False

    @abstractmethod
    def streamer(self, starts_open: bool) -> PieceStreamer: ...

    def split(self, text: str, starts_open: bool) -> Split:
        streamer = self.streamer(starts_open)
        reasoning, content = streamer.feed(text)
        more_reasoning, more_content = streamer.finish()
        return Split(reasoning + more_reasoning or None, content + more_content)


class ThinkStreamer:
    """A choice's text deltas -> (reasoning, content) pieces; a possible start of a tag is held back until known."""

    def __init__(self, starts_open: bool) -> None:
        self._state = "reasoning" if starts_open else "start"
        self._buf = ""

    def feed(self, text: str) -> tuple[str, str]:
        """The reasoning text and the content text this delta releases."""
        self._buf += text
        reasoning = content = ""
        while True:
            if self._state == "start":
                head = self._buf.lstrip()
                if head.startswith(OPEN):
                    self._state, self._buf = "reasoning", head[len(OPEN) :]
                    continue
                if OPEN.startswith(head):  # nothing yet, or the start of "<think>"
                    return reasoning, content
                self._state = "content"
                continue
            if self._state == "reasoning":
                at = self._buf.find(CLOSE)
                if at == -1:
                    keep = partial_suffix(self._buf, CLOSE)
                    reasoning += self._buf[: len(self._buf) - keep]
                    self._buf = self._buf[len(self._buf) - keep :]
                    return reasoning, content
                reasoning += self._buf[:at]
                self._state, self._buf = "after", self._buf[at + len(CLOSE) :]
                continue
            if self._state == "after":  # the whitespace between the reasoning and the answer is neither
                self._buf = self._buf.lstrip()
                if not self._buf:
                    return reasoning, content
                self._state = "content"
            content += self._buf
            self._buf = ""
            return reasoning, content

    def finish(self) -> tuple[str, str]:
        rest, self._buf = self._buf, ""
        if self._state == "reasoning":
            return rest, ""
        return "", rest if self._state != "after" else ""


class ThinkParser(ReasoningParser):
    """`<think>...</think>` reasoning; `always_open`: the answer starts inside it whatever the prompt says."""

    def __init__(self, name: str, always_open: bool) -> None:
        self.name = name
        self.always_open = always_open

    def starts_open(self, prompt_tail: str) -> bool:
        return self.always_open or prompt_tail.rstrip().endswith(OPEN)

    def streamer(self, starts_open: bool) -> ThinkStreamer:
        return ThinkStreamer(starts_open)


class HarmonyParser(ReasoningParser):
    """gpt-oss: the `analysis` channel is reasoning; calls go on to the tool stage as Hermes blocks (harmony.py)."""

    name = "openai_gptoss"
    needs_special_tokens = True

    def streamer(self, starts_open: bool) -> HarmonyStreamer:
        return HarmonyStreamer()


PARSERS: dict[str, ReasoningParser] = {
    p.name: p for p in (ThinkParser("qwen3", False), ThinkParser("deepseek_r1", True), HarmonyParser())
}
HARMONY_SIGN = "<|channel|>"


def reasoning_parser_for(setting: str, chat_template: str | None) -> ReasoningParser | None:
    """The model's reasoning parser from `parameters.reasoning_parser` (`auto`: from its chat template)."""
    if setting == AUTO:
        if chat_template and HARMONY_SIGN in chat_template:
            return PARSERS["openai_gptoss"]
        return PARSERS["qwen3"] if chat_template and OPEN in chat_template else None
    if setting == NONE:
        return None
    parser = PARSERS.get(setting)
    if parser is None:
        raise InternalError(
            f"the model's reasoning parser is misconfigured; use one of {sorted([AUTO, NONE, *PARSERS])}"
        )
    return parser


@dataclass(frozen=True)
class Reasoning:
    """How one request's answers are split into reasoning and content."""

    parser: ReasoningParser
    starts_open: bool  # the prompt opened the reasoning: the answer begins inside it

    def split(self, text: str) -> Split:
        return self.parser.split(text, self.starts_open)

    def streamer(self) -> PieceStreamer:
        return self.parser.streamer(self.starts_open)


def reasoning_for(
    parser: ReasoningParser | None, tokenizer: Tokenizer, prompt: list[int], guided: bool
) -> Reasoning | None:
    """How this prompt's answers are split by the model's reasoning parser (`ModelParsers.reasoning`), unless the
    answer is grammar-constrained (the grammar leaves no room to reason)."""
    if parser is None or guided:
        return None
    return Reasoning(parser, parser.starts_open(tokenizer.decode(prompt[-8:], skip_special_tokens=False)))
