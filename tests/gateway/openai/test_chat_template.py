"""Tools and past tool calls reach the prompt, whether or not the model's template knows about them."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from engines.hf_tokenizer import HFTokenizer
from gateway.errors import InvalidRequestError
from gateway.llm.tool_parsers import HermesParser
from gateway.openai.chat_template import render_chat, template_support
from gateway.openai.protocol import ChatMessage

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather by city", "parameters": PARAMETERS},
    }
]
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees and sunny"},
]
TOOL_AWARE_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}[call {{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %}"
    "</{{ m.role }}>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)


def render(tokenizer: HFTokenizer, messages: list[dict], tools=None, kwargs=None) -> str:
    msgs = [ChatMessage.model_validate(m) for m in messages]
    ids = asyncio.run(render_chat(tokenizer, msgs, tools, HermesParser(), kwargs))
    return tokenizer.decode(ids, skip_special_tokens=False)


@pytest.fixture(scope="module")
def tool_aware(smol_tokenizer) -> HFTokenizer:
    hf = AutoTokenizer.from_pretrained(smol_tokenizer.hf.name_or_path)
    hf.chat_template = TOOL_AWARE_TEMPLATE
    return HFTokenizer(hf)


def test_smollm2_template_ignores_tools_so_we_describe_them(smol_tokenizer) -> None:
    support = template_support(smol_tokenizer)
    assert not support.tools and not support.tool_calls
    text = render(smol_tokenizer, HISTORY[:1], TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools") and '"name": "get_weather"' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_past_calls_and_results_round_trip_as_text(smol_tokenizer) -> None:
    text = render(smol_tokenizer, HISTORY, TOOLS)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>tool\n22 degrees and sunny<|im_end|>" in text
    # a system message of the user's own is kept, with the tools appended to it
    text = render(smol_tokenizer, [{"role": "system", "content": "Be brief."}, *HISTORY], TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")


def test_templates_that_know_tools_get_them_natively(tool_aware) -> None:
    support = template_support(tool_aware)
    assert support.tools and support.tool_calls
    text = render(tool_aware, HISTORY, TOOLS)
    assert text.startswith("<tools>get_weather;</tools>") and "# Tools" not in text
    # arguments reach the template as a mapping (as vLLM passes them), not as an escaped string
    assert '[call get_weather {"city": "Paris"}]' in text
    assert "<tool>22 degrees and sunny</tool>" in text


def test_template_kwargs_cannot_replace_reserved_arguments(smol_tokenizer) -> None:
    text = render(smol_tokenizer, HISTORY[:1], None, {"add_generation_prompt": False, "tools": "x", "messages": []})
    assert text.endswith("<|im_start|>assistant\n") and "Weather in Paris?" in text


def test_non_text_parts_and_empty_messages_are_400(smol_tokenizer) -> None:
    with pytest.raises(InvalidRequestError) as info:
        render(smol_tokenizer, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    assert info.value.param == "messages.0.content"
    with pytest.raises(InvalidRequestError) as info:
        render(smol_tokenizer, [{"role": "user", "content": None}])
    assert info.value.param == "messages.0.content"
