"""`PassthroughScheduler`: the scheduler of a model served by an upstream used as it is (`backend: openai`).

It admits requests with the admission scheduler's queue (admission_queue.py: `max_num_seqs` in flight, the rest
waiting by priority, a bounded queue, timeouts and expected-wait shedding, 429 with Retry-After), records the same
request metrics (time to first token, tokens, latency, Triton's counters: each answer is passed through
`LLMRequestStats.observe` as `GenerationOutput` updates that carry the upstream's body), and turns the engine's
errors into the gateway's. It holds no tokenizer: paths that need one (tokenize, KServe v2
generate, Anthropic's count_tokens) answer 400 and say why.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from engines.interface import PassthroughEngine, Tokenizer, UpstreamError, UpstreamTimeoutError
from engines.interface import UpstreamUnreachableError as EngineUnreachable
from engines.types import EngineInfo, GenerationOutput, GenerationRequest, SamplingParams
from gateway.errors import (
    BadGatewayError,
    GatewayTimeoutError,
    InvalidRequestError,
    PayloadTooLargeError,
    RateLimitError,
    ServiceUnavailableError,
    UpstreamConnectionError,
)
from gateway.repository.model_config import SchedulerConfig
from gateway.scheduler.llm.admission_queue import AdmissionQueue
from gateway.scheduler.llm.interface import LLMScheduler, Passthrough, SchedulerStats

_ids = itertools.count()


def gateway_error(exc: BaseException) -> BaseException:
    """The gateway's error for an engine's: the upstream's status and message where they are the client's business
    (a bad request, a rate limit), a bad gateway where they are not (its credentials, its failures)."""
    if isinstance(exc, UpstreamTimeoutError):
        return GatewayTimeoutError(str(exc))
    if isinstance(exc, EngineUnreachable):
        return UpstreamConnectionError(str(exc))
    if not isinstance(exc, UpstreamError):
        return exc
    status, message = exc.status, exc.message
    retry = {"Retry-After": f"{exc.retry_after:g}"} if exc.retry_after is not None else {}
    if status in (401, 403):
        return BadGatewayError(
            f"the upstream refused the gateway's credentials (HTTP {status}: {message}); check "
            "the model's openai.api_key_env or openai.api_key_file"
        )
    if status == 408:
        return GatewayTimeoutError(f"the upstream timed out (HTTP 408: {message})")
    if status == 413:
        return PayloadTooLargeError(f"the upstream refused the request as too large: {message}")
    if status == 429:
        return RateLimitError(f"the upstream is rate limiting: {message}", headers=retry or {"Retry-After": "1"})
    if status == 503:
        return ServiceUnavailableError(f"the upstream is unavailable: {message}", headers=retry or {"Retry-After": "5"})
    if status == 404:  # the upstream does not serve the model or the endpoint: the gateway's config, not the client
        return BadGatewayError(f"the upstream answered 404: {message}")
    if 400 <= status < 500:
        return InvalidRequestError(message, param=exc.param, code=exc.code)
    return BadGatewayError(f"the upstream failed (HTTP {status}): {message}")


class _NoTokenizer(Tokenizer):
    """What a passthrough model has instead of a tokenizer: every use is a clear 400."""

    def __init__(self, name: str) -> None:
        self._name = name

    def _refuse(self) -> InvalidRequestError:
        return InvalidRequestError(
            f"the model '{self._name}' is served by an OpenAI-compatible upstream as it is (backend: openai) and has "
            "no tokenizer here; use /v1/chat/completions, /v1/completions or /v1/embeddings",
            param="model",
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        raise self._refuse()

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        raise self._refuse()

    def convert_ids_to_tokens(self, token_ids: Sequence[int]) -> list[str]:
        raise self._refuse()

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> list[int]:
        raise self._refuse()

    @property
    def vocab_size(self) -> int:
        return 0

    @property
    def all_special_ids(self) -> list[int]:
        return []


@dataclass
class _Update(GenerationOutput):
    """A request-metrics update that carries the upstream's body (an answer or a chunk) through `observe`."""

    body: dict[str, Any] | None = None


def _usage(body: dict[str, Any]) -> tuple[int, int] | None:
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (prompt if isinstance(prompt, int) else 0), (completion if isinstance(completion, int) else 0)


def _finish(body: dict[str, Any]) -> str | None:
    for choice in body.get("choices") or ():
        if isinstance(choice, dict) and choice.get("finish_reason"):
            return str(choice["finish_reason"])
    return None


def _has_output(chunk: dict[str, Any]) -> bool:
    """Whether a chunk carries generated output (text, reasoning or a tool call), for the time to first token."""
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and (
            delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content") or delta.get("reasoning")
        ):
            return True
        if choice.get("text"):
            return True
    return False


class PassthroughScheduler(LLMScheduler, Passthrough):
    def __init__(self, engine: PassthroughEngine, name: str, limits: SchedulerConfig | None = None) -> None:
        self._engine = engine
        self._queue = AdmissionQueue(limits or SchedulerConfig())
        self._tokenizer = _NoTokenizer(name)
        self._running = 0
        self._started = False
        self._stats = SchedulerStats()

    # -- LLMScheduler -------------------------------------------------------------------------------------------
    @property
    def info(self) -> EngineInfo:
        return self._engine.info

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def engine(self) -> PassthroughEngine:
        return self._engine

    @property
    def passthrough(self) -> Passthrough:
        return self

    @property
    def healthy(self) -> bool:
        return self._started  # whatever the upstream does: its failures are per request, and routes fall back

    async def start(self) -> None:
        await self._engine.start()
        self._started = True

    async def stop(self) -> None:
        self._started = False
        self._queue.close()
        await self._engine.shutdown()

    def stats(self) -> SchedulerStats:
        self._stats.running = self._running
        self._queue.record(self._stats)
        return self._stats

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        raise self._tokenizer._refuse()
        yield  # an async generator, as the contract has it

    # -- Passthrough ----------------------------------------------------------------------------------------------
    @property
    def upstream_model(self) -> str:
        return self._engine.upstream_model

    async def call(
        self, endpoint: str, body: dict[str, Any], priority: int = 0, timeout: float | None = None
    ) -> dict[str, Any]:
        request = self._shadow(body, priority, timeout)
        answer: dict[str, Any] | None = None
        async for out in self._stats.requests.observe(request, self._answer(request, endpoint, body)):
            answer = out.body if isinstance(out, _Update) else answer
        assert answer is not None  # _answer yields exactly one update, with the body
        return answer

    async def stream(
        self, endpoint: str, body: dict[str, Any], priority: int = 0, timeout: float | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        request = self._shadow(body, priority, timeout)
        updates = self._stats.requests.observe(request, self._chunks(request, endpoint, body))
        try:
            first = await anext(updates)
        except BaseException:
            await cast(AsyncGenerator[GenerationOutput, None], updates).aclose()
            raise
        return self._bodies(first, updates)

    # -- one request --------------------------------------------------------------------------------------------
    @staticmethod
    def _shadow(body: dict[str, Any], priority: int, timeout: float | None) -> GenerationRequest:
        """The request as the admission queue and the request metrics see it (no prompt tokens are known here)."""
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        sampling = SamplingParams(max_tokens=max_tokens if isinstance(max_tokens, int) else 0)
        return GenerationRequest(
            f"passthrough-{next(_ids)}", [], sampling, priority, arrival_time=time.monotonic(), queue_timeout=timeout
        )

    @contextlib.asynccontextmanager
    async def _admitted(self, request: GenerationRequest) -> AsyncIterator[None]:
        if not self._started:
            raise ServiceUnavailableError("the model is not running; try again later", headers={"Retry-After": "5"})
        await self._queue.acquire(request)
        self._stats.requests.scheduled(request.request_id)
        self._running += 1
        try:
            yield
        finally:
            self._running -= 1
            self._queue.release()

    async def _answer(self, request: GenerationRequest, endpoint: str, body: dict[str, Any]) -> AsyncIterator[_Update]:
        async with self._admitted(request):
            try:
                answer = await self._engine.request(endpoint, body, request.trace_headers)
            except (UpstreamError, EngineUnreachable, UpstreamTimeoutError) as exc:
                raise gateway_error(exc) from None
        prompt, completion = _usage(answer) or (0, 0)
        yield _Update(
            request.request_id,
            [],
            "",
            finished=True,
            finish_reason=_finish(answer) or "stop",
            prompt_tokens=prompt,
            completion_tokens=completion,
            body=answer,
        )

    async def _chunks(self, request: GenerationRequest, endpoint: str, body: dict[str, Any]) -> AsyncIterator[_Update]:
        async with self._admitted(request):
            outputs = 0  # chunks with output: the completion tokens until the upstream's usage says
            usage: tuple[int, int] | None = None
            finish: str | None = None
            try:
                stream = cast(
                    AsyncGenerator[dict[str, Any], None], self._engine.stream(endpoint, body, request.trace_headers)
                )
                async with contextlib.aclosing(stream) as chunks:
                    async for chunk in chunks:
                        outputs += _has_output(chunk)
                        usage = _usage(chunk) or usage
                        finish = _finish(chunk) or finish
                        yield _Update(request.request_id, [], "", completion_tokens=outputs, body=chunk)
            except (UpstreamError, EngineUnreachable, UpstreamTimeoutError) as exc:
                raise gateway_error(exc) from None
        prompt, completion = usage or (0, outputs)
        yield _Update(
            request.request_id,
            [],
            "",
            finished=True,
            finish_reason=finish or "stop",
            prompt_tokens=prompt,
            completion_tokens=max(completion, outputs),
        )

    @staticmethod
    async def _bodies(
        first: GenerationOutput, updates: AsyncIterator[GenerationOutput]
    ) -> AsyncIterator[dict[str, Any]]:
        try:
            if isinstance(first, _Update) and first.body is not None:
                yield first.body
            async for out in updates:
                if isinstance(out, _Update) and out.body is not None:
                    yield out.body
        finally:
            await updates.aclose()  # type: ignore[attr-defined]
