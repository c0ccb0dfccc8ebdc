"""A batch's input file: OpenAI's JSONL, one request per line, checked before anything runs.

Each line is `{"custom_id": "...", "method": "POST", "url": "<the batch's endpoint>", "body": {...}}`. A file with
any line that is not such a request fails the whole batch at validation, as on OpenAI, and the batch's
`errors.data` lists what is wrong line by line (1-based line numbers, at most `MAX_ERRORS`), so the file can be
fixed at once. Blank lines are skipped. What the body holds is the endpoint's business: a body the endpoint refuses
is that request's 400 in the error file, not a validation error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
MAX_ERRORS = 100
MAX_CUSTOM_ID = 512


@dataclass(frozen=True)
class LineError:
    """One thing wrong with the input file (OpenAI's BatchError)."""

    code: str
    message: str
    line: int | None = None  # 1-based line of the file
    param: str | None = None

    def to_openai(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass(frozen=True)
class RequestLine:
    """One request of the batch: `index` counts requests from 0 (blank lines do not count)."""

    index: int
    custom_id: str
    body: dict[str, Any]


@dataclass
class Validation:
    """What checking a whole file found."""

    total: int = 0
    errors: list[LineError] = field(default_factory=list)
    models: set[str] = field(default_factory=set)
    error_count: int = 0  # errors found, including those past MAX_ERRORS

    @property
    def ok(self) -> bool:
        return self.error_count == 0

    def add(self, error: LineError) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(error)


def numbered(lines: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """The file's non-blank lines with their 1-based line numbers."""
    for number, raw in enumerate(lines, 1):
        if raw.strip():
            yield number, raw


def _missing(name: str, number: int) -> LineError:
    return LineError("missing_required_parameter", f"Missing required parameter: '{name}'.", number, name)


def parse_line(raw: bytes | str, number: int, index: int, endpoint: str) -> RequestLine | LineError:
    """The request on line `number` (the `index`-th request), or what is wrong with it."""
    try:
        item = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return LineError("invalid_json_line", "This line is not parseable as valid JSON.", number)
    if not isinstance(item, dict):
        return LineError("invalid_json_line", "This line is not a JSON object.", number)
    for name in ("custom_id", "method", "url", "body"):
        if item.get(name) is None:
            return _missing(name, number)
    custom_id, method, url, body = item["custom_id"], item["method"], item["url"], item["body"]
    if not isinstance(custom_id, str) or not 0 < len(custom_id) <= MAX_CUSTOM_ID:
        return LineError(
            "invalid_custom_id", f"custom_id must be a string of 1 to {MAX_CUSTOM_ID} characters.", number, "custom_id"
        )
    if method != "POST":
        return LineError("invalid_method", "The method must be 'POST'.", number, "method")
    if url != endpoint:
        return LineError(
            "invalid_url",
            f"The URL provided for this request does not match the batch endpoint '{endpoint}'.",
            number,
            "url",
        )
    if not isinstance(body, dict):
        return LineError("invalid_body", "body must be a JSON object (the request's body).", number, "body")
    if not isinstance(body.get("model"), str) or not body["model"]:
        return _missing("body.model", number)
    return RequestLine(index, custom_id, body)


def validate(lines: Iterable[bytes], endpoint: str, max_requests: int) -> Validation:
    """Check every line of an input file for a batch on `endpoint`."""
    result = Validation()
    seen: set[str] = set()
    for number, raw in numbered(lines):
        result.total += 1
        if result.total > max_requests:
            result.add(
                LineError(
                    "batch_too_large",
                    f"The batch input file holds more than {max_requests} "
                    "requests (--batch-max-requests); split it into several batches.",
                    number,
                )
            )
            break
        parsed = parse_line(raw, number, result.total - 1, endpoint)
        if isinstance(parsed, LineError):
            result.add(parsed)
            continue
        if parsed.custom_id in seen:
            result.add(
                LineError(
                    "duplicate_custom_id",
                    "The custom_id for this request is a duplicate of another "
                    "request. The custom_id parameter must be unique for each request in a batch.",
                    number,
                    "custom_id",
                )
            )
            continue
        seen.add(parsed.custom_id)
        result.models.add(parsed.body["model"])
    if result.total == 0:
        result.add(LineError("empty_file", "The batch input file is empty."))
    return result


def requests(lines: Iterable[bytes], endpoint: str) -> Iterator[RequestLine]:
    """The requests of a file that passed `validate`, in order."""
    for index, (number, raw) in enumerate(numbered(lines)):
        parsed = parse_line(raw, number, index, endpoint)
        if isinstance(parsed, LineError):  # the file changed under us; validation let this line through
            raise ValueError(f"line {number} of a validated batch input is invalid: {parsed.message}")
        yield parsed
