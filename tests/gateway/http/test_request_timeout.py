"""X-Request-Timeout: the header wins over the body's field, and a bad value is a 400 naming `timeout`."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from gateway.errors import InvalidRequestError
from gateway.http.request_timeout import request_timeout


def _request(value: str | None) -> Request:
    headers = [] if value is None else [(b"x-request-timeout", value.encode())]
    return Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers})


def test_header_body_and_bad_values() -> None:
    assert request_timeout(_request(None)) is None
    assert request_timeout(_request(None), 4.0) == 4.0
    assert request_timeout(_request("2.5"), 4.0) == 2.5
    for bad in ("soon", "0", "-1", "nan", "inf", "3601"):
        with pytest.raises(InvalidRequestError) as err:
            request_timeout(_request(bad))
        assert err.value.param == "timeout" and "X-Request-Timeout" in err.value.message
