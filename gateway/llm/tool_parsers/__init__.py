"""Tool-call dialects: how a model family writes calls, read back into OpenAI `tool_calls` (whole and streamed).

A dialect is chosen per model with `parameters.tool_parser` in its config, as vLLM's `--tool-call-parser`; `auto`
(the default) picks it from the model's chat template (`detect`), once when the model loads (gateway/llm/parsers.py):

* `hermes`: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (Hermes, Qwen 2.5 / 3, and the dialect
  tools are described in for templates that ignore `tools`: SmolLM2, Gemma, Phi-3).
* `llama3_json`: `{"name": ..., "parameters": {...}}` at the start of the answer, maybe after `<|python_tag|>`.
* `mistral`: `[TOOL_CALLS][{...}]`, or `[TOOL_CALLS]name[ARGS]{...}` from Mistral's v11 tokenizer.
* `phi4_mini_json`: `<|tool_call|>[{...}]<|/tool_call|>`.
* `json`: the whole answer is `{"name": ..., "arguments": {...}}` or a list of them.

Each dialect also describes tools in a system prompt and writes past calls back as text, for chat templates that
ignore `tools` / `tool_calls`, and gives the Lark grammar that forces its own format when `tool_choice` is
`required` or names a function (see tools.py).
"""

from __future__ import annotations

from gateway.errors import InternalError
from gateway.llm.tool_parsers.base import (
    MAX_PARALLEL_CALLS,
    ParsedCall,
    StreamEvent,
    ToolCallDelta,
    ToolParser,
    ToolStreamer,
    content_of,
    new_call_id,
)
from gateway.llm.tool_parsers.hermes import HermesParser
from gateway.llm.tool_parsers.json_calls import JsonParser, Llama3JsonParser
from gateway.llm.tool_parsers.mistral import MistralParser
from gateway.llm.tool_parsers.phi4_mini import Phi4MiniParser

PARSERS: dict[str, ToolParser] = {
    p.name: p for p in (HermesParser(), Llama3JsonParser(), MistralParser(), Phi4MiniParser(), JsonParser())
}
AUTO = "auto"
FALLBACK = "hermes"

# What a template writes (or asks the model to write) for calls -> the dialect, most specific first.
_SIGNS = (
    ("[TOOL_CALLS]", "mistral"),
    ("<tool_call>", "hermes"),
    ("<|python_tag|>", "llama3_json"),
    ('"parameters": dictionary of argument name', "llama3_json"),
    ("<|tool_call|>", "phi4_mini_json"),
    ("<|tool|>", "phi4_mini_json"),
)


def detect(chat_template: str | None) -> str:
    """The dialect a chat template's family writes; `hermes` for templates that say nothing of tools (the tools are
    then described in the system message in that dialect)."""
    for sign, name in _SIGNS:
        if chat_template and sign in chat_template:
            return name
    return FALLBACK


def tool_parser_for(setting: str, chat_template: str | None) -> ToolParser:
    """The model's dialect from `parameters.tool_parser` (`auto`: the one its chat template implies)."""
    name = detect(chat_template) if setting == AUTO else setting
    parser = PARSERS.get(name)
    if parser is None:
        raise InternalError(f"the model's tool parser is misconfigured; use one of {sorted([AUTO, *PARSERS])}")
    return parser


__all__ = [
    "AUTO",
    "MAX_PARALLEL_CALLS",
    "PARSERS",
    "HermesParser",
    "JsonParser",
    "Llama3JsonParser",
    "MistralParser",
    "ParsedCall",
    "Phi4MiniParser",
    "StreamEvent",
    "ToolCallDelta",
    "ToolParser",
    "ToolStreamer",
    "content_of",
    "detect",
    "new_call_id",
    "tool_parser_for",
]
