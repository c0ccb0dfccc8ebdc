"""A model's tool-call dialect and reasoning parser, chosen once when it loads and held by its `LoadedLLM`.

The choice reads `parameters.tool_parser` / `parameters.reasoning_parser` of the model's config and, for `auto`,
the chat template's source (tool_parsers/, reasoning.py); neither changes while the model is served, so every
frontend (chat, Responses, Anthropic, Ollama, /tokenize) takes the same answer from `LoadedLLM.parsers` instead of
reading the config and the template again per request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.llm.reasoning import ReasoningParser, reasoning_parser_for
from gateway.llm.tool_parsers import AUTO, ToolParser, tool_parser_for


@dataclass(frozen=True)
class ModelParsers:
    tool: ToolParser  # the dialect calls are written and read in (also for templates that ignore tools)
    reasoning: ReasoningParser | None  # None: the model's answers are all content


def model_parsers(parameters: Mapping[str, Any] | None, chat_template: str | None) -> ModelParsers:
    """The parsers a model's config `parameters` name (`auto`: the ones `chat_template` implies); an unknown name
    raises InternalError with the choices (the config check refuses it first, model_config.py)."""
    parameters = parameters or {}
    return ModelParsers(
        tool=tool_parser_for(str(parameters.get("tool_parser", AUTO)), chat_template),
        reasoning=reasoning_parser_for(str(parameters.get("reasoning_parser", AUTO)), chat_template),
    )
