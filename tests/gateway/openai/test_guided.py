"""Guided decoding with the real tokenizer: whatever is sampled under the mask parses and validates."""

from __future__ import annotations

import asyncio
import json
import random
import time

import jsonschema
import pytest
import torch

from gateway.errors import InvalidRequestError
from gateway.llm import grammar_compiler
from gateway.llm.grammar_compiler import GuidedDecoder, close_objects
from tests.gateway.openai.conftest import EOS

VOCAB = 49152
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 6},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city"],
        },
    },
    "required": ["name", "age", "role", "address"],
}


@pytest.fixture(scope="module")
def decoder(smol_tokenizer) -> GuidedDecoder:
    return GuidedDecoder(smol_tokenizer, VOCAB, EOS)


def compile_schema(decoder: GuidedDecoder, schema, **kw):
    return asyncio.run(decoder.json_schema(schema, param="response_format", **kw))


def random_walk(constraint, rng: random.Random, max_steps: int = 400) -> list[int]:
    tokens = []
    for _ in range(max_steps):
        mask = constraint.allowed_mask(VOCAB)
        assert mask.dtype == torch.bool and mask.shape == (VOCAB,)
        allowed = mask.nonzero().flatten().tolist()
        token = rng.choice(allowed)
        if token in EOS:
            return tokens
        constraint.accept(token)
        tokens.append(token)
    raise AssertionError("the grammar never let the walk end")


@pytest.mark.parametrize("seed", range(6))
def test_random_sampling_under_the_mask_always_validates(decoder, smol_tokenizer, seed: int) -> None:
    compiled = compile_schema(decoder, PERSON)
    tokens = random_walk(compiled.constraint(), random.Random(seed))
    doc = json.loads(smol_tokenizer.decode(tokens))
    jsonschema.validate(doc, PERSON)
    assert set(doc) <= set(PERSON["properties"])  # objects are closed unless the schema says otherwise


def test_valid_text_passes_and_invalid_text_is_blocked(decoder, smol_tokenizer) -> None:
    compiled = compile_schema(decoder, PERSON)

    def walk(text: str) -> bool:
        c = compiled.constraint()
        for token in smol_tokenizer.encode(text, add_special_tokens=False):
            if not c.allowed_mask(VOCAB)[token]:
                return False
            c.accept(token)
        return bool(c.allowed_mask(VOCAB)[EOS[0]])

    good = {"name": "Ada", "age": 36, "role": "admin", "active": True, "tags": ["a"], "address": {"city": "Paris"}}
    assert walk(json.dumps(good))
    assert not walk(json.dumps({**good, "role": "root"}))
    assert not walk(json.dumps({**good, "age": 200}))
    assert not walk(json.dumps({"name": "Ada", "age": 36}))  # required fields missing: the end is not allowed
    assert not walk(json.dumps(good, indent=2))  # no free whitespace: a small model could emit it forever


def test_finished_grammar_allows_only_end_of_sequence(decoder, smol_tokenizer) -> None:
    c = compile_schema(decoder, {"enum": ["yes"]}).constraint()
    for token in smol_tokenizer.encode('"yes"', add_special_tokens=False):
        c.accept(token)
    assert c.allowed_mask(VOCAB).nonzero().flatten().tolist() == EOS


def test_mask_fits_the_model_vocabulary(decoder) -> None:
    c = compile_schema(decoder, {"type": "object"}).constraint()
    wide = c.allowed_mask(VOCAB + 64)
    assert wide.shape == (VOCAB + 64,) and not wide[VOCAB:].any()
    assert c.allowed_mask(VOCAB - 10).shape == (VOCAB - 10,)


def test_a_rejected_token_ends_the_sequence_instead_of_raising(decoder, smol_tokenizer) -> None:
    c = compile_schema(decoder, {"type": "object"}).constraint()
    c.accept(smol_tokenizer.encode("hello", add_special_tokens=False)[0])  # not JSON: the engine ignored the mask
    assert c.allowed_mask(VOCAB).nonzero().flatten().tolist() == EOS


def _deep(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        (_deep(10_000), "nested"),
        ({"$ref": "#"}, "no JSON value"),
        ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "no JSON value"),
        ({"type": "strnig"}, "not a valid JSON Schema"),
        ({"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}}, "guided decoding"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "Unsatisfiable"),
        ({"type": "object", "properties": {f"p{i}": {"description": "x" * 300} for i in range(1000)}}, "KiB"),
        ([{"type": "string"}], "JSON Schema object"),
    ],
)
def test_bad_schemas_are_400_with_param(decoder, schema, words: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        compile_schema(decoder, schema)
    assert info.value.status == 400 and info.value.param == "response_format"
    assert words in info.value.message


def test_recursive_schemas_that_terminate_are_fine(decoder, smol_tokenizer) -> None:
    kids = {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}
    node = {"type": "object", "properties": {"v": {"enum": [1, 2]}, "kids": kids}, "required": ["v"]}
    tree = {"$defs": {"node": node}, "$ref": "#/$defs/node"}
    compiled = compile_schema(decoder, tree)
    c = compiled.constraint()
    for token in smol_tokenizer.encode('{"v": 1, "kids": [{"v": 2}]}', add_special_tokens=False):
        assert c.allowed_mask(VOCAB)[token]
        c.accept(token)


def test_compiled_grammars_are_cached_with_a_bound(smol_tokenizer) -> None:
    decoder = GuidedDecoder(smol_tokenizer, VOCAB, EOS, cache_size=2)
    first = compile_schema(decoder, {"enum": [1]})
    assert compile_schema(decoder, {"enum": [1]}) is first
    compile_schema(decoder, {"enum": [2]})
    compile_schema(decoder, {"enum": [3]})
    assert decoder.cache_len() == 2
    assert compile_schema(decoder, {"enum": [1]}) is not first  # evicted, compiled again


def test_compile_time_is_bounded(decoder, monkeypatch) -> None:
    compile_schema(decoder, {"enum": [0]})  # the tokenizer conversion is done once, not timed
    monkeypatch.setattr(grammar_compiler, "COMPILE_TIMEOUT_S", 0)
    with pytest.raises(InvalidRequestError) as info:
        compile_schema(decoder, {"type": "object", "properties": {"slow": {"type": "string"}}})
    assert "took longer" in info.value.message and info.value.param == "response_format"


def test_lark_grammars_compile_and_bad_ones_are_400(decoder) -> None:
    ok = asyncio.run(decoder.lark('start: "yes" | "no"', param="tools"))
    assert ok.constraint().allowed_mask(VOCAB).any()
    with pytest.raises(InvalidRequestError) as info:
        asyncio.run(decoder.lark("start: undefined_rule", param="tools"))
    assert info.value.param == "tools"


def test_close_objects_respects_explicit_choices() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {}, "additionalProperties": True}},
        "anyOf": [{"properties": {"b": {}}}],
    }
    closed = close_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is True
    assert closed["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in close_objects({"type": "object"})  # json_object stays open
    assert "additionalProperties" not in schema  # the request's own schema is left alone


def test_regex_and_choice_grammars(decoder, smol_tokenizer) -> None:
    rng = random.Random(0)
    compiled = asyncio.run(decoder.regex(r"[0-9]{3}-[a-z]{2}", param="structured_outputs"))
    for _ in range(3):
        text = smol_tokenizer.decode(random_walk(compiled.constraint(), rng))
        assert len(text) == 6 and text[:3].isdigit() and text[3] == "-" and text[4:].isalpha()
    choices = ['say "hi"', "naïve\\path", "two\nlines"]
    source = "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
    compiled = asyncio.run(decoder.lark(source, param="structured_outputs"))
    seen = {smol_tokenizer.decode(random_walk(compiled.constraint(), rng)) for _ in range(12)}
    assert seen <= set(choices) and seen


@pytest.mark.parametrize("pattern", ["(a", "[z-a]", "a{5,2}", "(?<=a)b"])
def test_bad_regexes_are_400(decoder, pattern: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        asyncio.run(decoder.regex(pattern, param="structured_outputs"))
    assert info.value.param == "structured_outputs"


@pytest.mark.parametrize("pattern", ["(a|a)*(b|b)*c", "(x+x+)+y", "a{1000}{1000}", "([a-z]{1,100}){1,100}@"])
def test_pathological_regexes_are_bounded(decoder, pattern: str) -> None:
    started = time.monotonic()
    try:
        compiled = asyncio.run(decoder.regex(pattern, param="structured_outputs"))
    except InvalidRequestError as exc:  # refused by llguidance's limits: fine, as long as it is quick
        assert exc.param == "structured_outputs"
    else:
        c = compiled.constraint()
        for _ in range(5):
            allowed = c.allowed_mask(VOCAB).nonzero().flatten().tolist()
            c.accept(allowed[0])
    assert time.monotonic() - started < 30
