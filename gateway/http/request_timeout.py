"""The client's admission timeout of an LLM request: how long it may wait in the model's queue before it starts.

Given as the `X-Request-Timeout` header (seconds) on every LLM route (/v1 chat, completions, responses, messages),
or as the body's `timeout` field (seconds) on chat, completions and responses; the header wins, as X-Session-ID
does. It bounds the wait for admission only (Triton's request `timeout`): a request that started is never cut.
The model's `scheduler` section says whether requests may set it (`allow_timeout_override`) and what happens when
it passes (`timeout_action`); see gateway/scheduler/llm/queue_policy.py.
"""

from __future__ import annotations

import math

from fastapi import Request

from gateway.errors import InvalidRequestError

HEADER = "X-Request-Timeout"
MAX_TIMEOUT_S = 3600.0


def request_timeout(request: Request, body_value: float | None = None) -> float | None:
    """The request's timeout in seconds (None: the model's default); 400 for a header that is not one."""
    raw = request.headers.get(HEADER)
    if raw is None:
        return body_value
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_TIMEOUT_S:  # NaN fails too
        raise InvalidRequestError(
            f"{HEADER} must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}", param="timeout"
        )
    return value
