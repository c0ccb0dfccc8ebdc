"""The OpenAI frontend's hand-over to a model served by an upstream as it is (`backend: openai`,
docs/passthrough.md).

The chat, completions and embeddings handlers check a request as for any model, then, when the model's scheduler
has a `passthrough`, call `forward` instead of rendering a chat template or tokenizing: the client's body goes to
the upstream as the client sent it (tools, response_format, logprobs and any extension field included) with only
the gateway's own fields (`session_id`, `priority`, `timeout`: the wait for admission in the model's queue) taken
out and `model` set to the upstream's name. Streams always ask for the upstream's usage (for the metrics); a client
that did not ask for it gets none. Answers come back under our model name. The Responses and Anthropic Messages
APIs convert to a `ChatCompletionRequest` and call the chat handler, so they reach the upstream through this seam
too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from gateway.scheduler.llm.interface import Passthrough

GATEWAY_FIELDS = {"session_id", "priority", "timeout"}  # read by the gateway (admission, KV sessions), not upstreams


def upstream_body(req: BaseModel, upstream_model: str) -> dict[str, Any]:
    """The request as the client sent it (unset defaults left out, aliases as on the wire), for the upstream."""
    body = req.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude=GATEWAY_FIELDS)
    body["model"] = upstream_model
    if not body.get("tools"):  # OpenAI refuses these without tools; the Messages adapter always sets them
        body.pop("tool_choice", None)
        body.pop("parallel_tool_calls", None)
    if body.get("include_stop_str_in_output") is False:  # vLLM's extension at its default: strict APIs refuse it
        del body["include_stop_str_in_output"]
    return body


async def forward(
    direct: Passthrough, endpoint: str, req: BaseModel, name: str, force_usage: bool = False, priority: int = 0
) -> dict[str, Any] | AsyncIterator[dict[str, Any]]:
    """The upstream's answer to `req` (or, for a stream, its chunks: primed, so a failure before the first is an
    HTTP error) with `model` set to `name`, the model the client asked for."""
    body = upstream_body(req, direct.upstream_model)
    timeout = getattr(req, "timeout", None)  # the client's admission timeout (gateway/http/request_timeout.py)
    if not body.get("stream"):
        answer = await direct.call(endpoint, body, priority, timeout)
        answer["model"] = name
        return answer
    options = body.get("stream_options")
    asked = isinstance(options, dict) and bool(options.get("include_usage"))
    body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return _renamed(await direct.stream(endpoint, body, priority, timeout), name, force_usage or asked)


async def _renamed(chunks: AsyncIterator[dict[str, Any]], name: str, usage: bool) -> AsyncIterator[dict[str, Any]]:
    try:
        async for chunk in chunks:
            if not usage:
                if not chunk.get("choices") and chunk.get("usage") is not None:
                    continue  # the usage chunk asked for the metrics' sake
                chunk.pop("usage", None)
            chunk["model"] = name
            yield chunk
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
