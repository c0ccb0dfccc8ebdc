"""What the OpenAI and v2 frontends need from any LLM model, whatever engine serves it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from engines.interface import AsyncGenerateEngine, PassthroughEngine, StepEngine, Tokenizer
from engines.types import EngineInfo, GenerationOutput, GenerationRequest
from gateway.observability.request_metrics import LLMRequestStats

#: The engines an LLM scheduler drives: stepped by the gateway, batching internally, or an upstream used as it is.
LLMEngine = StepEngine | AsyncGenerateEngine | PassthroughEngine


@dataclass
class SchedulerStats:
    """Scheduler state as data, for metrics and health. `requests` holds the per-request metrics, which every
    scheduler records by passing its `generate` stream through `requests.observe`."""

    running: int = 0
    waiting: int = 0
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0
    preemptions: int = 0
    steps: int = 0
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    sessions: int = 0
    session_pinned_blocks: int = 0
    spec_drafts: int = 0  # speculative verifications (vLLM's spec_decode_num_drafts)
    spec_draft_tokens: int = 0  # tokens proposed in them
    spec_accepted_tokens: int = 0  # of those, accepted
    rejected: dict[str, int] = field(default_factory=dict)  # requests refused by the queue policy, by reason
    expected_wait_seconds: float = 0.0  # how long a request arriving now is expected to wait for admission
    requests: LLMRequestStats = field(default_factory=LLMRequestStats)

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


class Passthrough(ABC):
    """A model that answers OpenAI request bodies itself (`backend: openai`: an upstream used as it is).

    The frontends hand such a model the client's chat, completions or embeddings body after their own checks and
    before any chat template or tokenizer: the upstream renders and counts. This is the seam for every API that
    converts to chat (Responses, Anthropic Messages): they build a `ChatCompletionRequest` as for any model, and
    the chat handler passes it here instead of templating it. Errors are the gateway's: a refusal by the upstream
    keeps its status and message where they are the client's business (400, 429), a failure of the upstream is a
    502 (`BadGatewayError`, `UpstreamConnectionError`), 503 or 504 (`GatewayTimeoutError`).
    """

    @property
    @abstractmethod
    def upstream_model(self) -> str:
        """The name the upstream serves the model under (the `model` of the bodies sent)."""

    @abstractmethod
    async def call(
        self, endpoint: str, body: dict[str, Any], priority: int = 0, timeout: float | None = None
    ) -> dict[str, Any]:
        """The upstream's answer to `body` at `/v1/<endpoint>` (`chat/completions`, `completions`, `embeddings`).
        `priority` and `timeout` (the longest wait for admission, None: the model's default) are the client's, for
        the model's queue."""

    @abstractmethod
    async def stream(
        self, endpoint: str, body: dict[str, Any], priority: int = 0, timeout: float | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """The upstream's chunks for a streaming `body`, primed: this returns once the first chunk has arrived, so
        a failure before it is an ordinary error (a route falls back on it); one after it ends the iterator with
        the error. Closing the iterator stops the upstream's generation."""


class LLMScheduler(ABC):
    @property
    @abstractmethod
    def info(self) -> EngineInfo: ...

    @property
    @abstractmethod
    def tokenizer(self) -> Tokenizer: ...

    @property
    @abstractmethod
    def engine(self) -> LLMEngine:
        """The engine this scheduler drives: LoRA adapters load into it, its capabilities say how guided decoding
        runs (`AsyncGenerateEngine.enforces_guided_spec`), and a failed load shuts it down."""

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    @abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        """Queue `request` and stream its updates. Closing the iterator early aborts the request.

        Implementations return `self.stats().requests.observe(request, <their stream>)` and call
        `requests.scheduled(request_id)` on admission: that is where every engine's LLM metrics are recorded."""

    @abstractmethod
    def stats(self) -> SchedulerStats: ...

    def delete_session(self, session_id: str) -> bool:
        """End a stateful KV session; False if this model holds no such session."""
        return False

    @property
    def healthy(self) -> bool:
        """False when the model cannot serve (its engine died, no upstream is reachable): health reports not ready."""
        return True

    @property
    def passthrough(self) -> Passthrough | None:
        """The model's upstream when it serves OpenAI bodies as they are (see `Passthrough`); None otherwise."""
        return None


def admission_key(request: GenerationRequest, order: int, now: float, aging_seconds: float) -> tuple[float, int]:
    """Admission order: lower `priority` first, then arrival; a request that has waited longer than
    `aging_seconds` goes ahead of every priority, so low priorities cannot starve."""
    starving = now - request.arrival_time > aging_seconds
    return (float("-inf") if starving else request.priority, order)
