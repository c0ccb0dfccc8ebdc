"""What a model's chat template renders itself, probed once per model (`LoadedLLM.template_support`).

Templates differ: some render `tools` and assistant `tool_calls` (Qwen, Hermes, Llama 3.1, Mistral), many ignore
both (SmolLM2, Gemma, Phi-3), and some know no system turn (Gemma 2) or no `tool` role (Gemma, Phi-3). The probe
renders a few small conversations with a marker and looks for it in the output; the chat path
(gateway/openai/chat_template.py) writes whatever the template leaves out into the messages itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engines.interface import Tokenizer

_PROBE_NAME = "zq_probe_fn"
_PROBE_RESULT = "zq_probe_result"
_PROBE_ID = "zqprobe01"  # 9 alphanumeric characters: Mistral's templates refuse any other call id
_PROBE_TOOL = {
    "type": "function",
    "function": {"name": _PROBE_NAME, "description": "probe", "parameters": {"type": "object", "properties": {}}},
}


@dataclass(frozen=True)
class TemplateSupport:
    tools: bool
    tool_calls: bool
    system: bool = True  # Gemma 2's template refuses a system turn: the tool prompt then opens the first user turn
    tool_results: bool = True  # Gemma's and Phi-3's know no `tool` role: results are then written in a user turn


def _renders_probe(
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    generation_prompt: bool,
    probe: str = _PROBE_NAME,
) -> bool:
    try:
        ids = tokenizer.apply_chat_template(messages, tools, generation_prompt)
    except Exception:  # a template that refuses the probe does not support it
        return False
    return probe in tokenizer.decode(ids, skip_special_tokens=False)


def template_support(tokenizer: Tokenizer) -> TemplateSupport:
    """Probe `tokenizer`'s chat template (a few renders: a served model keeps the answer, LoadedLLM)."""
    user: dict[str, Any] = {"role": "user", "content": "hi"}
    call = {"id": _PROBE_ID, "type": "function", "function": {"name": _PROBE_NAME, "arguments": {}}}
    called: list[dict[str, Any]] = [user, {"role": "assistant", "content": "", "tool_calls": [call]}]
    history = [*called, {"role": "tool", "tool_call_id": _PROBE_ID, "content": _PROBE_RESULT}]
    return TemplateSupport(
        tools=_renders_probe(tokenizer, [user], [_PROBE_TOOL], True),
        tool_calls=(
            _renders_probe(tokenizer, history, [_PROBE_TOOL], False)
            or _renders_probe(tokenizer, called, [_PROBE_TOOL], False)
        ),
        tool_results=_renders_probe(tokenizer, history, [_PROBE_TOOL], False, _PROBE_RESULT),
        system=_renders_probe(tokenizer, [{"role": "system", "content": _PROBE_NAME}, user], None, True),
    )


def template_text(tokenizer: Tokenizer) -> str | None:
    """The chat template's source (the GGUF's `tokenizer.chat_template` or the folder's), for telling the family's
    tool-call and reasoning dialects; None when the tokenizer does not show it. Named templates are joined."""
    template = getattr(getattr(tokenizer, "hf", None), "chat_template", None)
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    return template if isinstance(template, str) else None
