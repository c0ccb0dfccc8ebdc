"""The chat templates of the common families (tests/gateway/openai/templates/) through the gateway's rendering: the
prompt is transformers' own rendering of the conversation, tools and past calls reach every family (natively where
the template knows them, described in the family's dialect where it does not), and the dialect and reasoning parser
are told from the template."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from engines.hf_tokenizer import HFTokenizer
from gateway.llm.reasoning import reasoning_parser_for
from gateway.llm.template_support import template_text
from gateway.llm.tool_parsers import PARSERS, detect
from gateway.openai.chat_template import TemplateSupport, render_chat, template_support
from gateway.openai.protocol import ChatMessage

TEMPLATES = Path(__file__).parent / "templates"
CALL_ID = "call_0123456789abcdef01234567"
SYSTEM = [{"role": "system", "content": "Be brief."}]
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": CALL_ID, "content": "22 degrees and sunny"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather by city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
NATIVE = TemplateSupport(tools=True, tool_calls=True, system=True, tool_results=True)
# template -> (what it renders itself, the tool-call dialect, the reasoning parser `auto` picks)
FAMILIES = {
    "meta-llama-Llama-3.1-8B-Instruct": (NATIVE, "llama3_json", None),
    "meta-llama-Llama-3.2-3B-Instruct": (NATIVE, "llama3_json", None),
    "Qwen-Qwen2.5-7B-Instruct": (NATIVE, "hermes", None),
    "Qwen-Qwen3-0.6B": (NATIVE, "hermes", "qwen3"),
    "mistralai-Mistral-Nemo-Instruct-2407": (NATIVE, "mistral", None),
    "Mistral-Small-3.2-24B-Instruct-2506": (NATIVE, "mistral", None),
    "google-gemma-2-2b-it": (TemplateSupport(False, False, system=False, tool_results=False), "hermes", None),
    "google-gemma-3-it": (TemplateSupport(False, False, system=True, tool_results=False), "hermes", None),
    "microsoft-Phi-3.5-mini-instruct": (TemplateSupport(False, False, system=True, tool_results=False), "hermes", None),
    "microsoft-Phi-4-mini-instruct": (
        TemplateSupport(False, False, system=True, tool_results=True),
        "phi4_mini_json",
        None,
    ),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": (
        TemplateSupport(False, True, system=True, tool_results=True),
        "hermes",
        "qwen3",
    ),
    # harmony: the reasoning parser hands calls on as hermes blocks
    "openai-gpt-oss-120b": (NATIVE, "hermes", "openai_gptoss"),
}


@pytest.fixture(scope="module")
def hf(smol_tokenizer):
    return AutoTokenizer.from_pretrained(smol_tokenizer.hf.name_or_path)


def _tokenizer(hf, name: str) -> HFTokenizer:
    hf.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
    return HFTokenizer(hf)  # a new wrapper: its template support is probed afresh


def _render(tokenizer: HFTokenizer, messages: list[dict], tools=None, kwargs=None) -> str:
    parser = PARSERS[detect(template_text(tokenizer))]
    msgs = [ChatMessage.model_validate(m) for m in messages]
    return tokenizer.decode(asyncio.run(render_chat(tokenizer, msgs, tools, parser, kwargs)), skip_special_tokens=False)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_is_told_from_its_template(hf, name: str) -> None:
    support, dialect, reasoning = FAMILIES[name]
    tokenizer = _tokenizer(hf, name)
    assert template_support(tokenizer) == support
    text = template_text(tokenizer)
    assert detect(text) == dialect
    assert getattr(reasoning_parser_for("auto", text), "name", None) == reasoning


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_prompt_is_transformers_rendering(hf, name: str) -> None:
    support = FAMILIES[name][0]
    tokenizer = _tokenizer(hf, name)
    chat = [*(SYSTEM if support.system else []), {"role": "user", "content": "Hi"}]
    expected = hf.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert _render(tokenizer, chat) == expected
    if not support.tools:
        return
    # with tools and a past call: the dicts transformers gets are vLLM's (arguments as a mapping)
    mistral = FAMILIES[name][1] == "mistral"
    call_id = PARSERS["mistral"].template_call_id(CALL_ID) if mistral else CALL_ID
    dicts = [
        *SYSTEM,
        HISTORY[0],
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "22 degrees and sunny"},
    ]
    expected = hf.apply_chat_template(dicts, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert _render(tokenizer, [*SYSTEM, *HISTORY], TOOLS) == expected


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_tools_and_a_tool_round_trip_reach_every_family(hf, name: str) -> None:
    support, dialect, _ = FAMILIES[name]
    tokenizer = _tokenizer(hf, name)
    text = _render(tokenizer, [*(SYSTEM if support.system else []), *HISTORY], TOOLS)
    assert '"get_weather"' in text or "get_weather" in text
    assert "Weather by city" in text  # the tool's description: native, or in the dialect's system prompt
    assert "Paris" in text and "22 degrees and sunny" in text
    if not support.tool_calls:  # the past call is written in the family's own dialect
        assert PARSERS[dialect].render_calls([{"name": "get_weather", "arguments": {"city": "Paris"}}]) in text
    if not support.tool_results:
        assert "<tool_response>\n22 degrees and sunny\n</tool_response>" in text


def test_gemma2_gets_the_tools_in_its_first_user_turn(hf) -> None:
    tokenizer = _tokenizer(hf, "google-gemma-2-2b-it")
    text = _render(tokenizer, HISTORY, TOOLS)
    assert text.index("# Tools") < text.index("Weather in Paris?") < text.index("<tool_response>")
    assert "<start_of_turn>system" not in text


def test_two_results_share_one_user_turn_where_there_is_no_tool_role(hf) -> None:
    tokenizer = _tokenizer(hf, "google-gemma-3-it")
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
        for i in range(2)
    ]
    history = [
        HISTORY[0],
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_0", "content": "one"},
        {"role": "tool", "tool_call_id": "call_1", "content": "two"},
    ]
    text = _render(tokenizer, history, TOOLS)  # Gemma's template insists on alternating turns
    assert "<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n</tool_response>" in text


def test_qwen3_thinking_switch_reaches_the_template(hf) -> None:
    tokenizer = _tokenizer(hf, "Qwen-Qwen3-0.6B")
    chat = [{"role": "user", "content": "Hi"}]
    assert _render(tokenizer, chat, kwargs={"enable_thinking": False}).endswith("<think>\n\n</think>\n\n")
    assert _render(tokenizer, chat).endswith("<|im_start|>assistant\n")


def test_mistral_history_with_openai_call_ids_renders(hf) -> None:
    for name in ("mistralai-Mistral-Nemo-Instruct-2407", "Mistral-Small-3.2-24B-Instruct-2506"):
        text = _render(_tokenizer(hf, name), HISTORY, TOOLS)
        assert PARSERS["mistral"].template_call_id(CALL_ID) in text and CALL_ID not in text
        assert json.dumps({"city": "Paris"}) in text
