"""A model's tool-call dialect and reasoning parser (gateway/llm/parsers.py): from its config, else its chat
template, chosen once and held by its `LoadedLLM`."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway.errors import InternalError
from gateway.llm import reasoning, tool_parsers
from gateway.llm.parsers import model_parsers
from gateway.repository.loaded_model import LoadedLLM
from gateway.repository.model_config import ModelConfig

TEMPLATES = Path(__file__).parents[1] / "openai" / "templates"  # the families' chat templates, shared


def test_auto_reads_the_chat_template() -> None:
    qwen3 = model_parsers({}, (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text())
    assert (qwen3.tool.name, getattr(qwen3.reasoning, "name", None)) == ("hermes", "qwen3")
    mistral = model_parsers(None, (TEMPLATES / "Mistral-Small-3.2-24B-Instruct-2506.jinja").read_text())
    assert (mistral.tool.name, mistral.reasoning) == ("mistral", None)
    bare = model_parsers({"tool_parser": "auto", "reasoning_parser": "auto"}, None)
    assert (bare.tool.name, bare.reasoning) == (tool_parsers.FALLBACK, None)


def test_the_config_overrides_the_template() -> None:
    qwen3 = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    chosen = model_parsers({"tool_parser": "llama3_json", "reasoning_parser": "none"}, qwen3)
    assert (chosen.tool, chosen.reasoning) == (tool_parsers.PARSERS["llama3_json"], None)
    r1 = model_parsers({"reasoning_parser": "deepseek_r1"}, None)
    assert r1.reasoning is reasoning.PARSERS["deepseek_r1"]


@pytest.mark.parametrize("parameters", [{"tool_parser": "hermes2"}, {"reasoning_parser": "o1"}])
def test_an_unknown_name_says_the_choices(parameters: dict[str, str]) -> None:
    with pytest.raises(InternalError, match="misconfigured; use one of"):
        model_parsers(parameters, None)


def test_a_served_model_chooses_once() -> None:
    """The choice is the model's: reading it again does not read the config or the template again."""
    hf = SimpleNamespace(chat_template=(TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text())
    scheduler = SimpleNamespace(tokenizer=SimpleNamespace(hf=hf))
    model = LoadedLLM(name="m", config=ModelConfig(), scheduler=scheduler)  # type: ignore[arg-type]
    first = model.parsers
    hf.chat_template = None
    assert model.parsers is first
    assert getattr(first.reasoning, "name", None) == "qwen3"
