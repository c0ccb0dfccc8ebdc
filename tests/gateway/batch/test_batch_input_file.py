"""A batch's input file: every way a line can be wrong is named with its line number, a good file yields its
requests in order, and blank lines neither count nor shift the numbering."""

from __future__ import annotations

import json

import pytest

from gateway.batch.input_file import MAX_ERRORS, LineError, RequestLine, parse_line, requests, validate

CHAT = "/v1/chat/completions"


def _line(custom_id: str = "a", url: str = CHAT, **fields: object) -> bytes:
    item = {
        "custom_id": custom_id,
        "method": "POST",
        "url": url,
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        **fields,
    }
    return json.dumps(item).encode()


def test_a_good_line_is_a_request() -> None:
    parsed = parse_line(_line("req-1"), 3, 2, CHAT)
    assert parsed == RequestLine(2, "req-1", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        (b"{not json", "invalid_json_line", None),
        (b"\xff\xfe{}", "invalid_json_line", None),  # not UTF-8
        (b"[1, 2]", "invalid_json_line", None),
        (b"[" * 100_000, "invalid_json_line", None),  # nested past the parser's recursion
        (
            json.dumps({"method": "POST", "url": CHAT, "body": {"model": "m"}}).encode(),
            "missing_required_parameter",
            "custom_id",
        ),
        (_line(method=None), "missing_required_parameter", "method"),
        (_line(body=None), "missing_required_parameter", "body"),
        (_line(custom_id=""), "invalid_custom_id", "custom_id"),
        (_line(custom_id="x" * 513), "invalid_custom_id", "custom_id"),
        (
            json.dumps({"custom_id": 7, "method": "POST", "url": CHAT, "body": {"model": "m"}}).encode(),
            "invalid_custom_id",
            "custom_id",
        ),
        (_line(method="GET"), "invalid_method", "method"),
        (_line(url="/v1/embeddings"), "invalid_url", "url"),
        (_line(body=["not", "an", "object"]), "invalid_body", "body"),
        (_line(body={"messages": []}), "missing_required_parameter", "body.model"),
        (_line(body={"model": 3}), "missing_required_parameter", "body.model"),
    ],
)
def test_what_is_wrong_with_a_line_is_named(raw: bytes, code: str, param: str | None) -> None:
    error = parse_line(raw, 7, 0, CHAT)
    assert isinstance(error, LineError)
    assert (error.code, error.param, error.line) == (code, param, 7)
    assert error.to_openai() == {"code": code, "message": error.message, "param": param, "line": 7}


def test_a_valid_file_counts_its_requests_and_models() -> None:
    lines = [
        _line("a"),
        b"\n",
        b"   \n",
        _line("b"),
        json.dumps(
            {"custom_id": "c", "method": "POST", "url": CHAT, "body": {"model": "other", "messages": []}}
        ).encode(),
    ]
    result = validate(lines, CHAT, max_requests=10)
    assert result.ok and result.total == 3 and result.models == {"m", "other"} and not result.errors
    found = list(requests(lines, CHAT))
    assert [(r.index, r.custom_id) for r in found] == [(0, "a"), (1, "b"), (2, "c")]


def test_errors_carry_file_line_numbers_and_duplicates_are_refused() -> None:
    lines = [_line("a"), b"", _line("a"), b"oops", _line("b", url="/v1/completions")]
    result = validate(lines, CHAT, max_requests=10)
    assert not result.ok
    assert [(e.line, e.code) for e in result.errors] == [
        (3, "duplicate_custom_id"),
        (4, "invalid_json_line"),
        (5, "invalid_url"),
    ]


def test_an_empty_file_fails() -> None:
    result = validate([b"\n", b"  "], CHAT, max_requests=10)
    assert [e.code for e in result.errors] == ["empty_file"] and result.total == 0


def test_too_many_requests_stop_the_check() -> None:
    result = validate([_line(str(i)) for i in range(5)], CHAT, max_requests=3)
    assert [(e.code, e.line) for e in result.errors] == [("batch_too_large", 4)]


def test_errors_listed_are_bounded_but_all_are_counted() -> None:
    result = validate([b"x"] * (MAX_ERRORS + 20), CHAT, max_requests=1000)
    assert len(result.errors) == MAX_ERRORS and result.error_count == MAX_ERRORS + 20


def test_requests_refuses_a_file_that_changed_after_validation() -> None:
    with pytest.raises(ValueError, match="line 2"):
        list(requests([_line("a"), b"{"], CHAT))
