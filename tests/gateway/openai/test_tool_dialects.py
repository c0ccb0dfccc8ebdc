"""Every family's tool-call dialect: whole answers, streams split at every character boundary, and forced answers
(sampled under the dialect's own grammar) cut at every character: a forced call is never content."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import jsonschema
import pytest

from engines.types import GuidedSpec
from gateway.llm.grammar_compiler import GuidedDecoder
from gateway.llm.tool_parsers import PARSERS, ToolCallDelta, ToolParser, content_of, detect
from tests.gateway.openai.conftest import EOS
from tests.gateway.openai.test_guided import VOCAB, random_walk

TEMPLATES = Path(__file__).parent / "templates"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 8}}, "required": ["tz"]},
    },
}
TOOLS = [WEATHER, TIME]
NAMES = {"get_weather", "get_time"}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
EXPECTED = [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"tz": "CET"})]

# (dialect, an answer in the family's own words, its content). Each holds EXPECTED's two calls.
ANSWERS = [
    (
        "hermes",
        (
            'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'
        ),
        "Checking.",
    ),
    (
        "llama3_json",
        (
            '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
            '{"name": "get_time", "parameters": {"tz": "CET"}}'
        ),
        None,
    ),
    (
        "llama3_json",
        (
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
            '{"name": "get_time", "parameters": {"tz": "CET"}}'
        ),
        None,
    ),
    (
        "mistral",
        (
            'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
            '{"name": "get_time", "arguments": {"tz": "CET"}}]'
        ),
        "Sure.",
    ),
    (
        "mistral",
        (
            '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}'
            '[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{"tz": "CET"}'
        ),
        None,
    ),
    (
        "phi4_mini_json",
        (
            '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
            '{"name": "get_time", "arguments": {"tz": "CET"}}]<|/tool_call|>'
        ),
        None,
    ),
    (
        "phi4_mini_json",
        (
            'functools[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
            '{"name": "get_time", "arguments": {"tz": "CET"}}]'
        ),
        None,
    ),
    (
        "json",
        (
            '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
            '{"name": "get_time", "arguments": {"tz": "CET"}}]'
        ),
        None,
    ),
]


def _rebuild(events: list) -> tuple[str, list[tuple[str, str]]]:
    """Content and (name, arguments text) per call, checking OpenAI's delta rules: id and name first, once."""
    calls: dict[int, list[str]] = {}
    for e in events:
        if not isinstance(e, ToolCallDelta):
            continue
        wire = e.to_openai()
        if "id" in wire:
            assert e.index not in calls and wire["id"].startswith("call_") and wire["function"]["name"]
            calls[e.index] = [wire["function"]["name"], wire["function"]["arguments"]]
        else:
            assert set(wire) == {"index", "function"} and set(wire["function"]) == {"arguments"}
            calls[e.index][1] += wire["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls)))
    return content_of(events), [(n, a) for n, a in (calls[i] for i in sorted(calls))]


def _stream(parser: ToolParser, pieces: list[str], trusted: bool, names: set[str] = NAMES, max_calls: int = 99):
    streamer = parser.streamer(names, trusted, max_calls)
    events = []
    for piece in pieces:
        events += streamer.feed(piece)
    return _rebuild(events + streamer.finish())


def _splits(text: str):
    yield list(text)  # a character at a time
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]


@pytest.mark.parametrize(("dialect", "text", "content"), ANSWERS)
def test_answers_parse_whole_and_streamed_at_every_split(dialect: str, text: str, content: str | None) -> None:
    parser = PARSERS[dialect]
    got_content, calls = parser.parse(text, NAMES)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in calls] == EXPECTED
    for pieces in _splits(text):
        streamed, streamed_calls = _stream(parser, pieces, trusted=False)
        assert streamed == (content or ""), pieces
        assert [(n, json.loads(a)) for n, a in streamed_calls] == EXPECTED, pieces


@pytest.mark.parametrize("dialect", sorted(PARSERS))
def test_plain_text_and_unknown_tools_stay_content(dialect: str) -> None:
    parser = PARSERS[dialect]
    for text in ("The weather is fine.", 'It costs {about} 3 euros; {"name": "x"}', ""):
        assert parser.parse(text, NAMES) == (text, [])
        for pieces in _splits(text) if text else [[""]]:
            assert _stream(parser, pieces, trusted=False) == (text, [])
    unknown = parser.render_calls([{"name": "launch_rocket", "arguments": {"when": "now"}}])
    assert parser.parse(unknown, NAMES) == (unknown, [])


def test_llama3_reads_calls_only_at_the_start() -> None:
    text = 'Here is one: {"name": "get_time", "parameters": {"tz": "CET"}}'
    assert PARSERS["llama3_json"].parse(text, NAMES) == (text, [])
    assert _stream(PARSERS["llama3_json"], [text[:5], text[5:]], trusted=False) == (text, [])


@pytest.mark.parametrize("dialect", sorted(PARSERS))
def test_rendered_past_calls_read_back(dialect: str) -> None:
    parser = PARSERS[dialect]
    written = parser.render_calls([{"name": n, "arguments": json.dumps(a)} for n, a in EXPECTED])
    content, calls = parser.parse(written, NAMES)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == EXPECTED


@pytest.fixture(scope="module")
def decoder(smol_tokenizer) -> GuidedDecoder:
    return GuidedDecoder(smol_tokenizer, VOCAB, EOS)


def _forced_answers(decoder: GuidedDecoder, tokenizer, parser: ToolParser, tools: list, parallel: bool) -> list[str]:
    compiled = asyncio.run(decoder.compile(GuidedSpec("lark", parser.grammar(tools, parallel), "tools"), "tools"))
    return [tokenizer.decode(random_walk(compiled.constraint(), random.Random(seed))) for seed in range(2)]


@pytest.mark.parametrize("dialect", sorted(PARSERS))
@pytest.mark.parametrize(("tools", "parallel"), [(TOOLS, True), ([TIME], False)])
def test_forced_answers_cut_anywhere_are_calls_never_content(
    decoder, smol_tokenizer, dialect: str, tools: list, parallel: bool
) -> None:
    """What the dialect's grammar lets a model write, cut at every character (max_tokens), reads as calls: whole
    ones equal to the uncut answer's, the last one with the start of its arguments, streamed or not."""
    parser = PARSERS[dialect]
    names = {t["function"]["name"] for t in tools}
    for answer in _forced_answers(decoder, smol_tokenizer, parser, tools, parallel):
        whole = parser.parse_forced(answer, names)
        assert whole and (parallel or len(whole) == 1)
        for call in whole:
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        for pieces in _splits(answer):
            content, streamed = _stream(parser, pieces, trusted=True, names=names)
            assert content == "" and [n for n, _ in streamed] == [c.name for c in whole], pieces
            assert all(_same_json(a, c.arguments) for (_, a), c in zip(streamed, whole, strict=True)), pieces
        for cut in range(1, len(answer) + 1):
            calls = parser.parse_forced(answer[:cut], names)
            assert len(calls) <= len(whole)
            for got, full in zip(calls[:-1], whole, strict=False):
                assert (got.name, json.loads(got.arguments)) == (full.name, json.loads(full.arguments))
            if calls:
                last, full = calls[-1], whole[len(calls) - 1]
                assert last.name == full.name
                assert _same_json(last.arguments, full.arguments) or _same_start(last.arguments, full.arguments), (
                    answer[:cut],
                    last,
                )
            if len(names) == 1:  # the only tool a forced answer can call is known from its first character
                assert calls, answer[:cut]
            for pieces in ([answer[:cut]], [answer[: cut // 2], answer[cut // 2 : cut]]):
                content, streamed = _stream(parser, pieces, trusted=True, names=names)
                assert content == "", answer[:cut]
                assert [n for n, _ in streamed] == [c.name for c in calls], answer[:cut]
                for (_, args), call in zip(streamed, calls, strict=True):
                    assert _same_json(args, call.arguments), (answer[:cut], args, call.arguments)


def _compact(text: str) -> str:
    return "".join(text.split())


def _same_start(part: str, full: str) -> bool:
    """`part` is the beginning of the arguments `full` (written with the same spacing, compared without it)."""
    return _compact(full).startswith(_compact(part))


def _same_json(a: str, b: str) -> bool:
    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return _compact(a) == _compact(b)


@pytest.mark.parametrize(
    ("template", "dialect"),
    [
        ("meta-llama-Llama-3.1-8B-Instruct", "llama3_json"),
        ("meta-llama-Llama-3.2-3B-Instruct", "llama3_json"),
        ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes"),
        ("Qwen-Qwen2.5-7B-Instruct", "hermes"),
        ("Qwen-Qwen3-0.6B", "hermes"),
        ("mistralai-Mistral-Nemo-Instruct-2407", "mistral"),
        ("Mistral-Small-3.2-24B-Instruct-2506", "mistral"),
        ("microsoft-Phi-4-mini-instruct", "phi4_mini_json"),
        ("google-gemma-2-2b-it", "hermes"),  # no convention of its own: tools described in the hermes dialect
        ("google-gemma-3-it", "hermes"),
        ("microsoft-Phi-3.5-mini-instruct", "hermes"),
    ],
)
def test_dialect_is_told_from_the_template(template: str, dialect: str) -> None:
    assert detect((TEMPLATES / f"{template}.jinja").read_text()) == dialect


def test_mistral_call_ids_fit_its_template() -> None:
    mistral = PARSERS["mistral"]
    assert mistral.template_call_id("call_0123456789abcdef01234567") == "f01234567"
    assert mistral.template_call_id("x") == "00000000x"
    assert PARSERS["hermes"].template_call_id("call_1") == "call_1"
