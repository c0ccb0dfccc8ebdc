"""Contracts that `gateway/` depends on. Engines implement these; the gateway never reaches past them.

There are two shapes of LLM engine:

* `StepEngine` -- engines that run one batched model step when told to (the native PyTorch engine). The gateway's
  sequence batcher owns admission, the token budget, the paged KV cache's block tables, preemption and
  detokenization, and calls `execute` once per step from a worker thread.
* `AsyncGenerateEngine` -- engines that batch internally (vLLM, TensorRT-LLM, remote upstreams). The gateway
  admits, orders and aborts requests; the engine streams `GenerationOutput` updates.

Both expose a `Tokenizer` so the gateway can render chat templates and count tokens itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from typing import Any

from engines.types import EngineInfo, GenerationOutput, GenerationRequest, SequenceStep, StepResult


class TokenConstraint(ABC):
    """Restricts which token may come next, for one sequence (guided decoding).

    The engine asks for the mask right before sampling (on its worker thread); the scheduler reports each
    sampled token with `accept` (on the event loop) before the next step. A finished constraint allows only
    end-of-sequence tokens, so generation stops with finish_reason "stop".
    """

    @abstractmethod
    def allowed_mask(self, vocab_size: int) -> Any | None:
        """A bool torch tensor [vocab_size], True where allowed; None if every token is allowed now."""

    @abstractmethod
    def accept(self, token_id: int) -> None:
        """Advance past a sampled token."""


class Tokenizer(ABC):
    """Text <-> token ids, plus the model's chat template."""

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    @abstractmethod
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    @abstractmethod
    def convert_ids_to_tokens(self, token_ids: Sequence[int]) -> list[str]: ...

    @abstractmethod
    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> list[int]:
        """Render `messages` with the model's own template and return the prompt's token ids."""

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abstractmethod
    def all_special_ids(self) -> list[int]: ...


class StepEngine(ABC):
    """An engine driven step by step by the gateway's scheduler.

    `execute` is blocking (it runs the model); the scheduler calls it from one dedicated worker thread, never on
    the event loop, and never concurrently with itself.
    """

    @property
    @abstractmethod
    def info(self) -> EngineInfo: ...

    @property
    @abstractmethod
    def tokenizer(self) -> Tokenizer: ...

    @abstractmethod
    def execute(self, batch: Sequence[SequenceStep]) -> StepResult:
        """Run one forward pass over `batch` (prefill chunks and decodes mixed) and sample where asked."""

    def release(self, seq_id: str) -> None:  # noqa: B027 - optional hook
        """Forget any per-sequence state (e.g. a seeded RNG). Called when a sequence finishes or is aborted."""

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Free resources. Called once when the model is unloaded."""


class AsyncGenerateEngine(ABC):
    """An engine that schedules internally and streams results for each request."""

    @property
    @abstractmethod
    def info(self) -> EngineInfo: ...

    @property
    @abstractmethod
    def tokenizer(self) -> Tokenizer: ...

    @abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        """Stream updates for `request` until one has `finished=True`."""

    @abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stop generating for `request_id`; idempotent."""

    async def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Free resources. Called once when the model is unloaded."""
