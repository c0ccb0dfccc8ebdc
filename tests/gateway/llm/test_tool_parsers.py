"""Tool-call dialects: whole answers and streams read back into OpenAI's shapes, split at every possible point."""

from __future__ import annotations

import json
import random

import pytest

from gateway.llm.tool_parsers import HermesParser, JsonParser, ToolCallDelta, content_of, hermes
from gateway.llm.tool_parsers.base import CloseOutsideStrings

NAMES = {"get_weather", "get_time"}
HERMES = HermesParser()
JSON = JsonParser()

TWO_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c", "where": {"a": [1, {"b": 2}]}}}'
    '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Rome"}}\n</tool_call>'
)
EXPECTED = [
    ("get_weather", {"city": "Paris", "unit": "c", "where": {"a": [1, {"b": 2}]}}),
    ("get_time", {"city": "Rome"}),
]


def _pieces(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 40))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def _stream(parser, text: str, trusted: bool, rng: random.Random, max_calls: int = 99) -> list:
    streamer = parser.streamer(NAMES, trusted, max_calls)
    events = []
    for piece in _pieces(text, rng):
        events += streamer.feed(piece)
    return events + streamer.finish()


def _calls_from_deltas(events: list) -> list[tuple[str, dict]]:
    """Rebuild calls the way the openai SDK and langchain do, checking the reference's delta rules on the way."""
    calls: dict[int, dict] = {}
    for e in events:
        if not isinstance(e, ToolCallDelta):
            continue
        wire = e.to_openai()
        assert "index" in wire
        if wire.get("id"):
            assert e.index not in calls, "id/name only on the first delta of a call"
            assert wire["id"].startswith("call_") and wire["type"] == "function" and wire["function"]["name"]
            calls[e.index] = {"name": wire["function"]["name"], "arguments": wire["function"]["arguments"]}
        else:
            assert set(wire) == {"index", "function"} and set(wire["function"]) == {"arguments"}
            assert isinstance(wire["function"]["arguments"], str)
            calls[e.index]["arguments"] += wire["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls)))
    return [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())]


def test_hermes_parses_calls_and_keeps_surrounding_text() -> None:
    content, calls = HERMES.parse("Let me check.\n" + TWO_CALLS, NAMES)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == EXPECTED


def test_hermes_leaves_invalid_or_unknown_calls_as_content() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>'
    assert HERMES.parse(text, NAMES) == (text, [])
    unknown = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    assert HERMES.parse(unknown, NAMES) == (unknown, [])
    # an unterminated last call (the model stopped right after the JSON) and "parameters" instead of "arguments"
    unterminated = 'Here: <tool_call>\n{"name": "get_time", "parameters": {"city": "Oslo"}}'
    content, calls = HERMES.parse(unterminated, NAMES)
    assert content == "Here:" and calls[0].name == "get_time" and json.loads(calls[0].arguments) == {"city": "Oslo"}
    events = _stream(HERMES, unterminated, False, random.Random(4))
    assert content_of(events) == "Here:" and _calls_from_deltas(events) == [("get_time", {"city": "Oslo"})]


@pytest.mark.parametrize("trusted", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_hermes_stream_equals_whole_parse(trusted: bool, seed: int) -> None:
    events = _stream(HERMES, TWO_CALLS, trusted, random.Random(seed))
    assert content_of(events) == ""
    assert _calls_from_deltas(events) == EXPECTED


def test_trusted_stream_sends_arguments_before_the_call_closes() -> None:
    streamer = HERMES.streamer(NAMES, True, 99)
    events = streamer.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa')
    assert isinstance(events[0], ToolCallDelta) and events[0].name == "get_weather"
    assert "".join(e.arguments for e in events[1:]) == '{"city": "Pa'
    # the closing brace may end the call: it is held back until the next text shows it does not
    events = streamer.feed('ris"}')
    assert "".join(e.arguments for e in events) == 'ris"'
    events = streamer.feed("}\n</tool_call>")
    assert "".join(e.arguments for e in events) == "}"
    assert streamer.finish() == [] and streamer.calls == 1


@pytest.mark.parametrize("seed", range(8))
def test_hermes_stream_content_around_calls(seed: int) -> None:
    text = "Sure <b>bold</b> < tool_call. " + TWO_CALLS + " Done. "
    events = _stream(HERMES, text, False, random.Random(seed))
    # whitespace touching a call is dropped, the same way whether streamed or not
    assert content_of(events) == HERMES.parse(text, NAMES)[0] == "Sure <b>bold</b> < tool_call.Done."
    assert _calls_from_deltas(events) == EXPECTED


def test_hermes_stream_invalid_call_becomes_content() -> None:
    text = "a <tool_call>not json</tool_call> b"
    events = _stream(HERMES, text, False, random.Random(1))
    assert content_of(events) == text and not any(isinstance(e, ToolCallDelta) for e in events)


def test_max_calls_drops_extra_calls() -> None:
    for trusted in (True, False):
        events = _stream(HERMES, TWO_CALLS, trusted, random.Random(3), max_calls=1)
        assert _calls_from_deltas(events) == EXPECTED[:1]


def test_trusted_stream_cut_by_max_tokens_sends_what_there_is() -> None:
    streamer = HERMES.streamer(NAMES, True, 99)
    events = streamer.feed('<tool_call>\n{"name": "get_time", "arguments": {"city": "Ro') + streamer.finish()
    assert "".join(e.arguments for e in events if isinstance(e, ToolCallDelta)) == '{"city": "Ro'


def test_plain_text_streams_through_untouched() -> None:
    text = "The weather is nice; no tools needed.\n"
    events = _stream(HERMES, text, False, random.Random(5))
    assert content_of(events) == text


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_time", "arguments": {"city": "Rome"}}',
        '```json\n{"name": "get_time", "arguments": {"city": "Rome"}}\n```',
        (
            '[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
            '{"name": "get_time", "arguments": {"city": "Rome"}}]'
        ),
    ],
)
def test_json_dialect(text: str) -> None:
    content, calls = JSON.parse(text, NAMES)
    assert content is None and calls and all(c.name in NAMES for c in calls)
    events = _stream(JSON, text, False, random.Random(2))
    assert [name for name, _ in _calls_from_deltas(events)] == [c.name for c in calls]


def test_json_dialect_plain_answers() -> None:
    for text in ("Hello there", '{"not": "a call"}', '[{"name": "nope", "arguments": {}}]'):
        assert JSON.parse(text, NAMES) == (text, [])
        assert content_of(_stream(JSON, text, False, random.Random(0))) == text


def test_prompts_and_rendering_name_the_tools() -> None:
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    for parser in (HERMES, JSON):
        assert "get_time" in parser.system_prompt([tool])
        written = parser.render_calls([{"name": "get_time", "arguments": '{"city": "Rome"}'}])
        content, calls = parser.parse(written, NAMES)
        assert content is None and json.loads(calls[0].arguments) == {"city": "Rome"}


# A forced call whose argument value itself holds the closing tag (the call grammar allows any string there, and a
# small model that wants to end the call writes it): found in a soak, where the call was cut at the tag inside the
# string and came back with `{"city": "Paris` as its arguments and finish_reason "tool_calls".
TAG_IN_STRING = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris</tool_call>\\"x"}}\n</tool_call>'
    '\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Rome"}}\n</tool_call>'
)
TAG_IN_STRING_CALLS = [("get_weather", {"city": 'Paris</tool_call>"x'}), ("get_time", {"city": "Rome"})]


def test_closing_tag_inside_an_argument_string_is_part_of_the_value() -> None:
    forced = HERMES.parse_forced(TAG_IN_STRING, NAMES)
    assert [(c.name, json.loads(c.arguments)) for c in forced] == TAG_IN_STRING_CALLS
    content, calls = HERMES.parse(TAG_IN_STRING, NAMES)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == TAG_IN_STRING_CALLS


@pytest.mark.parametrize("trusted", [True, False])
@pytest.mark.parametrize("seed", range(20))
def test_stream_with_closing_tag_inside_an_argument_string(trusted: bool, seed: int) -> None:
    events = _stream(HERMES, TAG_IN_STRING, trusted, random.Random(seed))
    assert content_of(events) == ""
    assert _calls_from_deltas(events) == TAG_IN_STRING_CALLS


def test_a_long_call_streamed_a_character_at_a_time_is_scanned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 20 KB call fed one character at a time comes out as the whole answer's parse, and the look-out for its
    closing tag goes on from where it stopped (strings and escapes remembered across pieces) instead of reading the
    call again from its start on every piece: the characters looked at stay within the text's length."""
    scans: list[CloseOutsideStrings] = []

    class Counted(CloseOutsideStrings):
        def __init__(self, marker: str, pos: int = 0) -> None:
            super().__init__(marker, pos)
            scans.append(self)

    monkeypatch.setattr(hermes, "CloseOutsideStrings", Counted)
    # strings holding the closing tag, escaped quotes and braces, nested objects: 20 KB of arguments
    args = {"notes": [f'line {i}: "</tool_call>" {{x}} \\ end' for i in range(500)], "where": {"a": [1, {"b": 2}]}}
    raw = json.dumps(args)
    assert len(raw) > 20_000
    text = f'<tool_call>\n{{"name": "get_weather", "arguments": {raw}}}\n</tool_call>'
    content, calls = HERMES.parse(text, NAMES)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", args)]
    for trusted in (True, False):
        scans.clear()
        streamer = HERMES.streamer(NAMES, trusted, 99)
        events = [e for ch in text for e in streamer.feed(ch)] + streamer.finish()
        assert content_of(events) == "" and _calls_from_deltas(events) == [("get_weather", args)]
        if trusted:  # the arguments stream as the model wrote them
            assert "".join(e.arguments for e in events if isinstance(e, ToolCallDelta)) == raw
        # every character once, the closing tag's first looked at again while the rest of the tag comes
        assert sum(s.examined for s in scans) <= len(text) + len(HermesParser.CLOSE)
