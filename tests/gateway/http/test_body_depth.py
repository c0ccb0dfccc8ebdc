"""The JSON body guard of the OpenAI routes: media types, nesting depth and lone surrogates, without a server."""

from __future__ import annotations

import json

import pytest

from gateway.http.body_depth import deepest_field, has_lone_surrogate, json_media_type


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "",
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/merge-patch+json",
    ],
)
def test_json_media_types_are_read(content_type: str | None) -> None:
    assert json_media_type(content_type)


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/msgpack",
        "multipart/form-data; boundary=x",
        "application/octet-stream",
        "text/json",
        "application/jsonx",
    ],
)
def test_other_media_types_are_refused(content_type: str) -> None:
    assert not json_media_type(content_type)


def test_the_field_nested_too_deeply_is_named() -> None:
    body = json.dumps({"model": "m", "response_format": {"a": [[[[0]]]]}}).encode()
    assert deepest_field(body, limit=4) == "response_format"
    assert deepest_field(body, limit=10) is None


def test_lone_surrogates_are_found_and_pairs_are_not() -> None:
    assert has_lone_surrogate(b'{"prompt": "\\ud800"}')
    assert not has_lone_surrogate(b'{"prompt": "\\ud83d\\ude00"}')
    assert not has_lone_surrogate(b'{"prompt": "plain"}')
