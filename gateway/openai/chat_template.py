"""Chat messages -> the model's own chat template -> prompt token ids, tools included.

Templates differ in what they know: some render `tools` and assistant `tool_calls` themselves (Qwen, Hermes,
Llama 3.1, Mistral), many templates ignore both (SmolLM2, Gemma, Phi-3), and some know no system turn (Gemma 2) or
no `tool` role (Gemma, Phi-3). Each model's template is probed once (gateway/llm/template_support.py; its
`LoadedLLM` keeps the answer); where it ignores them, the tools are described in the system message (or the first
user turn), past calls are written as text in the model's tool-call dialect and tool results as `<tool_response>`
blocks in a user turn, so a conversation with tool results round-trips on any model.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jinja2

from engines.interface import Tokenizer
from gateway.errors import InvalidRequestError
from gateway.llm.template_support import TemplateSupport, template_support
from gateway.llm.tool_parsers import ToolParser
from gateway.openai.protocol import ChatMessage

RESERVED_KWARGS = (
    "messages",
    "tools",
    "add_generation_prompt",
    "tokenize",
    "chat_template",
    "documents",
    # the rest of transformers' apply_chat_template parameters: a request may not steer the call itself
    "self",
    "conversation",
    "continue_final_message",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
    "processor_kwargs",
)


def _text(i: int, msg: ChatMessage) -> str | None:
    if not isinstance(msg.content, list):
        return msg.content
    texts = []
    for part in msg.content:
        if part.type != "text" or part.text is None:
            raise InvalidRequestError(
                f"content part type '{part.type[:32]}' is not supported by this model; send text parts",
                param=f"messages.{i}.content",
            )
        texts.append(part.text)
    return "\n".join(texts)


def _arguments(arguments: str | dict[str, Any]) -> Any:
    """Templates expect arguments as a mapping (vLLM passes them so too); keep text that is not a JSON object."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


def message_dicts(
    messages: list[ChatMessage], support: TemplateSupport, parser: ToolParser | None
) -> list[dict[str, Any]]:
    out = []
    for i, msg in enumerate(messages):
        content = _text(i, msg)
        if content is None and not msg.tool_calls:
            raise InvalidRequestError("a message needs content", param=f"messages.{i}.content")
        item: dict[str, Any] = {"role": msg.role, "content": content or ""}
        if msg.name is not None:
            item["name"] = msg.name
        if msg.tool_call_id is not None:
            item["tool_call_id"] = parser.template_call_id(msg.tool_call_id) if parser else msg.tool_call_id
        if msg.tool_calls:
            calls = [
                {
                    "id": parser.template_call_id(c.id) if parser else c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)},
                }
                for c in msg.tool_calls
            ]
            if support.tool_calls or parser is None:
                item["tool_calls"] = calls
            else:
                written = parser.render_calls([c["function"] for c in calls])
                item["content"] = f"{item['content']}\n{written}" if item["content"] else written
        if msg.role == "tool" and not support.tool_results and parser is not None:
            result = parser.render_result(item["content"])
            if out and out[-1].get("tool_result"):  # results of one turn's calls share one user turn
                out[-1]["content"] += f"\n{result}"
                continue
            item = {"role": "user", "content": result, "tool_result": True}
        out.append(item)
    for item in out:
        item.pop("tool_result", None)
    return out


def _with_tool_prompt(messages: list[dict[str, Any]], prompt: str, system: bool) -> list[dict[str, Any]]:
    """The tools' description in the system turn, or at the start of the first user turn where there is none."""
    roles = ("system", "developer") if system else ("user",)
    for i, message in enumerate(messages):
        if message["role"] in roles:
            joined = f"{message['content']}\n\n{prompt}" if system else f"{prompt}\n\n{message['content']}"
            return [*messages[:i], {**message, "content": joined.strip()}, *messages[i + 1 :]]
        if system or message["role"] not in ("system", "developer"):
            break
    return [{"role": "system" if system else "user", "content": prompt}, *messages]


def _render(
    tokenizer: Tokenizer,
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None,
    parser: ToolParser | None,
    add_generation_prompt: bool,
    kwargs: dict[str, Any],
    support: TemplateSupport | None,
) -> list[int]:
    support = support or template_support(tokenizer)
    dicts = message_dicts(messages, support, parser)
    if tools and not support.tools and parser is not None:
        dicts, tools = _with_tool_prompt(dicts, parser.system_prompt(tools), support.system), None
    return tokenizer.apply_chat_template(dicts, tools or None, add_generation_prompt, **kwargs)


async def render_chat(
    tokenizer: Tokenizer,
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None,
    parser: ToolParser | None,
    template_kwargs: dict[str, Any] | None,
    add_generation_prompt: bool = True,
    support: TemplateSupport | None = None,
) -> list[int]:
    """Prompt token ids. Templates are Jinja run in transformers' sandbox; rendering stays off the event loop.
    `support`: what the template renders itself (a served model's `LoadedLLM.template_support`); None probes it."""
    kwargs = {k: v for k, v in (template_kwargs or {}).items() if k not in RESERVED_KWARGS}
    try:
        prompt = await asyncio.to_thread(
            _render, tokenizer, messages, tools, parser, add_generation_prompt, kwargs, support
        )
    except jinja2.TemplateError as exc:
        message = f"the chat template rejected the messages: {str(exc)[:200]}"
        raise InvalidRequestError(message, param="messages") from None
    except (TypeError, ValueError) as exc:
        if not kwargs:
            raise
        # e.g. a kwarg that shadows a name the template calls (`range`, `raise_exception`)
        message = f"the chat template cannot be rendered with these chat_template_kwargs: {str(exc)[:200]}"
        raise InvalidRequestError(message, param="chat_template_kwargs") from None
    if not prompt:
        raise InvalidRequestError("the messages render to an empty prompt", param="messages")
    return prompt
