"""One batch request, answered by the same in-process path as its HTTP endpoint, at the lowest priority.

A line's body is read by the endpoint's own request model and answered by the functions the routes call
(`chat_completion`, `completion`, `embeddings_body`), so a batch request behaves exactly as the same request sent
over HTTP, errors included; nothing goes over the network. Its generation requests carry `BATCH_PRIORITY`, behind
any request a client sends: the schedulers admit them only when no interactive request waits (and aging keeps them
from starving). The answer becomes the line's record: OpenAI's `{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error"}`, for the output file when the status is 200 and the error file otherwise.

A line takes its model as an online request does (`ModelRegistry.acquire`): a model that loads on request is loaded
for it (the line waits), and the line holds the model until its answer is complete, so the memory budget never
evicts a model under a running line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from gateway.errors import InternalError, InvalidRequestError, SwitchyardError
from gateway.http.ids import random_hex
from gateway.http.request_timeout import MAX_TIMEOUT_S
from gateway.openai.chat import chat_completion
from gateway.openai.completions import completion
from gateway.openai.embeddings import EmbeddingRequest, embeddings_body
from gateway.openai.protocol import ChatCompletionRequest, CompletionRequest
from gateway.repository.model_use import close_use, open_use
from gateway.repository.registry import LoadedLLM, ModelRegistry
from gateway.tensor.embedding import embedding_model, lowest_priority

log = logging.getLogger("switchyard.batch")

BATCH_PRIORITY = 1 << 30  # lower is served first; clients' requests default to 0


@dataclass(frozen=True)
class Answer:
    status_code: int
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.status_code == 200

    def tokens(self) -> tuple[int, int, int]:
        """(input, cached input, output) tokens of a successful answer."""
        usage = self.body.get("usage") if self.ok else None
        if not isinstance(usage, dict):
            return 0, 0, 0
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return usage.get("prompt_tokens", 0), cached, usage.get("completion_tokens", 0)


def _invalid_body(exc: ValidationError) -> InvalidRequestError:
    """A body the endpoint's model refuses, as the HTTP route's 400 says it: the field and what is wrong."""
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first.get("loc", ()) if not any(c in str(p) for c in "[]"))
    more = f" ({exc.error_count() - 1} more errors)" if exc.error_count() > 1 else ""
    return InvalidRequestError(f"{param}: {first.get('msg', 'invalid value')}{more}"[:500], param=param or None)


def _no_stream(stream: bool | None) -> None:
    if stream:
        raise InvalidRequestError(
            "stream is not supported in a batch: the answer is written to the output file", param="stream"
        )


class LineExecutor:
    """Answers batch requests with the models of `registry`, looked up for each request (a model loaded or
    replaced while a batch runs is used from then on)."""

    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry

    async def answer(self, endpoint: str, body: dict[str, Any]) -> Answer:
        use = open_use()  # the line's hold on its model, as the HTTP middleware opens one per request
        try:
            return Answer(200, await self._answer(endpoint, body))
        except ValidationError as exc:
            return Answer(400, _invalid_body(exc).openai_body())
        except SwitchyardError as exc:
            return Answer(exc.status, exc.openai_body())
        except Exception:  # a bug: the line fails, the batch goes on
            log.exception("batch request to %s failed", endpoint)
            return Answer(500, InternalError("internal server error; see the server log").openai_body())
        finally:
            close_use(use)

    async def _answer(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        if endpoint == "/v1/embeddings":
            embedding = EmbeddingRequest.model_validate(body)
            model = await self.registry.acquire(embedding.model)
            return await embeddings_body(embedding, model, lowest_priority(embedding_model(model)))
        if endpoint == "/v1/chat/completions":
            chat = ChatCompletionRequest.model_validate(body)
            chat.check()
            _no_stream(chat.stream)
            chat.priority = BATCH_PRIORITY
            chat.timeout = chat.timeout or MAX_TIMEOUT_S  # lowest priority waits long; not the interactive default
            result = await chat_completion(chat, await self.registry.acquire_llm(chat.model), False)
        elif endpoint == "/v1/completions":
            text = CompletionRequest.model_validate(body)
            text.check()
            _no_stream(text.stream)
            text.priority = BATCH_PRIORITY
            text.timeout = text.timeout or MAX_TIMEOUT_S
            result = await completion(text, await self.registry.acquire_llm(text.model), False)
        else:
            raise InvalidRequestError(f"the Batch API does not serve {endpoint[:64]}", param="endpoint")
        assert isinstance(result, dict)  # not streamed
        return result

    def busy(self, model_name: str) -> bool:
        """Whether requests wait for admission to the model `model_name` (a batch then holds its next line back)."""
        model = self.registry.find(model_name)
        return isinstance(model, LoadedLLM) and model.scheduler.stats().waiting > 0


def answer_record(custom_id: str, answer: Answer) -> str:
    """The output or error file's line for an answered request."""
    record = {
        "id": f"batch_req_{random_hex()[:24]}",
        "custom_id": custom_id,
        "response": {"status_code": answer.status_code, "request_id": f"req_{random_hex()}", "body": answer.body},
        "error": None,
    }
    return orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def unrun_record(custom_id: str, code: str, message: str) -> str:
    """The error file's line for a request that never ran (the batch was cancelled or expired first)."""
    record = {
        "id": f"batch_req_{random_hex()[:24]}",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }
    return orjson.dumps(record).decode()
