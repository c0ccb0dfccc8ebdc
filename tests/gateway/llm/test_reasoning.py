"""`<think>` reasoning split from the answer, whole and streamed at every character boundary."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import InternalError
from gateway.llm.reasoning import PARSERS, Split, reasoning_parser_for

TEMPLATES = Path(__file__).parents[1] / "openai" / "templates"  # the families' chat templates, shared
QWEN3 = PARSERS["qwen3"]

# (answer, whether the prompt opened <think>, reasoning, content)
CASES = [
    ("<think>\nThe user greets me.\n</think>\n\nHello!", False, "\nThe user greets me.\n", "Hello!"),
    ("  <think>a < b </thin k></think>Yes", False, "a < b </thin k>", "Yes"),
    ("The user greets me.\n</think>\n\nHello!", True, "The user greets me.\n", "Hello!"),
    ("Hello! <think> is a tag.", False, None, "Hello! <think> is a tag."),
    ("<think>cut by max_tokens", False, "cut by max_tokens", ""),
    ("cut by max_tokens", True, "cut by max_tokens", ""),
    ("<thi", False, None, "<thi"),
    ("", False, None, ""),
    ("<think></think>\n\n", False, None, ""),
]


def _stream(pieces: list[str], starts_open: bool) -> tuple[str, str]:
    streamer = QWEN3.streamer(starts_open)
    reasoning = content = ""
    for piece in pieces:
        r, c = streamer.feed(piece)
        reasoning, content = reasoning + r, content + c
    r, c = streamer.finish()
    return reasoning + r, content + c


@pytest.mark.parametrize(("text", "starts_open", "reasoning", "content"), CASES)
def test_split_whole_and_streamed(text: str, starts_open: bool, reasoning: str | None, content: str) -> None:
    assert QWEN3.split(text, starts_open) == Split(reasoning, content)
    splits = [list(text), *([text[:i], text[i:]] for i in range(len(text) + 1))]
    for pieces in splits:
        assert _stream(pieces, starts_open) == (reasoning or "", content), pieces


HARMONY = [
    (
        "<|channel|>analysis<|message|>The user greets me.<|end|><|start|>assistant<|channel|>final<|message|>Hello!",
        "The user greets me.",
        "Hello!",
    ),
    (
        (
            "<|channel|>analysis<|message|>Needs the weather.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
        ),
        "Needs the weather.",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    ),
    (
        '<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{"tz": "CET"}<|call|>',
        None,
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>\n',
    ),
    ("<|channel|>analysis<|message|>cut by max_tok", "cut by max_tok", ""),
    ("<|channel|>analysis<|mess", None, ""),
    ("not harmony at all", None, "not harmony at all"),
]


@pytest.mark.parametrize(("text", "reasoning", "content"), HARMONY)
def test_gpt_oss_channels(text: str, reasoning: str | None, content: str) -> None:
    harmony = PARSERS["openai_gptoss"]
    assert harmony.split(text, False) == Split(reasoning, content)
    for pieces in [list(text), *([text[:i], text[i:]] for i in range(len(text) + 1))]:
        streamer = harmony.streamer(False)
        r = c = ""
        for piece in [*pieces, None]:
            dr, dc = streamer.finish() if piece is None else streamer.feed(piece)
            r, c = r + dr, c + dc
        assert (r, c) == (reasoning or "", content), pieces


def test_the_prompt_tells_whether_the_answer_starts_inside_the_reasoning() -> None:
    assert QWEN3.starts_open("<|im_start|>assistant\n<think>\n")
    assert not QWEN3.starts_open("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # Qwen3, enable_thinking=False
    assert not QWEN3.starts_open("<|im_start|>assistant\n")
    assert PARSERS["deepseek_r1"].starts_open("<｜Assistant｜>")  # vLLM's deepseek_r1 assumes so always


def test_parser_from_config_and_template() -> None:
    qwen3 = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    r1 = (TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text()
    llama = (TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text()
    assert reasoning_parser_for("auto", qwen3) is QWEN3
    assert reasoning_parser_for("auto", r1) is QWEN3  # its prompt ends in an open <think>, which starts_open reads
    assert reasoning_parser_for("auto", llama) is None
    assert reasoning_parser_for("auto", None) is None
    gpt_oss = (TEMPLATES / "openai-gpt-oss-120b.jinja").read_text()
    assert reasoning_parser_for("auto", gpt_oss) is PARSERS["openai_gptoss"]
    assert reasoning_parser_for("none", qwen3) is None
    assert reasoning_parser_for("deepseek_r1", None) is PARSERS["deepseek_r1"]
    with pytest.raises(InternalError, match="deepseek_r1"):
        reasoning_parser_for("o1", None)
