"""Contracts that `gateway/` depends on. Engines implement these; the gateway never reaches past them.

There are two shapes of LLM engine:

* `StepEngine` -- engines that run one batched model step when told to (the native PyTorch engine). The gateway's
  sequence batcher owns admission, the token budget, the paged KV cache's block tables, preemption and
  detokenization, and calls `execute` once per step from a worker thread.
* `AsyncGenerateEngine` -- engines that batch internally (vLLM, TensorRT-LLM, remote upstreams). The gateway
  admits, orders and aborts requests; the engine streams `GenerationOutput` updates.

Both expose a `Tokenizer` so the gateway can render chat templates and count tokens itself. A third shape,
`PassthroughEngine`, has none: it serves OpenAI request bodies as they are (text in, text out), for upstreams used
as they are (llama.cpp's server, vLLM, Ollama, a cloud API).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from typing import Any

from engines.types import AdapterRef, EngineInfo, GenerationOutput, GenerationRequest, SequenceStep, StepResult


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

    @property
    def max_chars_per_token(self) -> int | None:
        """An upper bound on the characters of text one token can stand for, or None if unknown. A text longer
        than this times the context length cannot fit it, which the gateway can tell without tokenizing it."""
        return None


class AdapterHost:
    """LoRA adapters over an engine's base model (docs/lora.md). Engines that serve them override both; the others
    refuse, saying so."""

    def load_adapter(self, adapter: AdapterRef) -> None:
        """Make `adapter`'s weights ready for requests that name it (blocking: reads its files; called off the event
        loop). Raises `ModelFileError` for files this model cannot take, with the fix."""
        raise RequestRefusedError(
            f"this model's engine ({type(self).__name__}) does not serve LoRA adapters; serve "
            "the base model with backend: pytorch or vllm",
            "lora_path",
        )

    def unload_adapter(self, adapter: AdapterRef) -> None:
        """Drop `adapter`'s weights; called once no request runs under it."""


class StepEngine(AdapterHost, ABC):
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


class RequestRefusedError(ValueError):
    """A request the engine cannot serve as asked (the gateway answers 400), with the request field at fault when
    the engine knows it (OpenAI's `param`); a plain `ValueError` means the same without a field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelFileError(ValueError):
    """A model file the engine cannot serve: truncated or corrupt, of an architecture or type it does not read, or
    disagreeing with its own config. Raised while loading, before anything reads past the file; the message names
    the file, the tensor at fault (where one is) and the fix, and is the model's load error (a bad model, not a
    fault of the server)."""


class UnsupportedModelError(ValueError):
    """A model the engine cannot serve (an architecture or a feature of it the engine does not implement), found
    before its weights load. The message names the model type, what the engine serves and the fix (another
    backend); the gateway reports it as the model's load failure."""


class InsufficientMemoryError(UnsupportedModelError):
    """A model whose weights exceed the memory this process may still use, found from the files' headers before
    any weight is read (loading it would end in the OOM killer). The message gives both figures and the fixes."""


class StepInputError(RuntimeError):
    """A step's inputs break what the engine's C kernels rely on: a token id outside the vocabulary, a block table
    too short for the step's positions or naming a block outside the KV pool. A scheduler bug, caught before the C
    call would read or write another sequence's cache; the step's requests end with an error (the batcher fails
    the step) and the server goes on."""


class EngineUnavailableError(RuntimeError):
    """The engine cannot take or finish requests right now (dead, stopped, every upstream down).

    The gateway answers 503 with Retry-After. Engines raise `ValueError` (or `RequestRefusedError`, naming the
    field) for a request they cannot serve as asked (the gateway answers 400 with the message) and end a stream
    with finish_reason "error" for a failure inside it.
    """


class AsyncGenerateEngine(AdapterHost, ABC):
    """An engine that schedules internally and streams results for each request.

    Errors: `generate` raises `ValueError` (bad request, 400) or `EngineUnavailableError` (503) before its first
    update; a failure after that ends the stream with an update whose finish_reason is "error" (or "abort" when
    the request may simply be retried).
    """

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

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Begin background work (health checks, event-loop-bound clients). Called once, on the event loop."""

    async def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Free resources. Called once when the model is unloaded."""

    @property
    def healthy(self) -> bool:
        """False once the engine cannot serve (dead engine, no live upstream): the model reports not ready."""
        return True

    @property
    def enforces_guided_spec(self) -> bool:
        """How this engine takes guided decoding (`response_format`, `structured_outputs`, forced tool calls).

        False (the default): the gateway compiles each request's `SamplingParams.guided` into a `TokenConstraint`
        (`SamplingParams.constraint`, with llguidance) and the engine applies its mask before sampling.
        True: the engine enforces `SamplingParams.guided` itself (vLLM's own structured outputs, an upstream
        server) and `constraint` stays None; the gateway only checks the request. Such an engine raises
        `ValueError` (400) for a `guided` it cannot enforce, and for a bare `constraint` it cannot apply.
        """
        return False

    def delete_session(self, session_id: str) -> bool:
        """Forget a session's affinity and state (e.g. its upstream pin); False if none was held."""
        return False


class TensorBackend(ABC):
    """A KServe v2 tensor model instance (python, onnxruntime, pytorch, transformers backends).

    The gateway creates one object per model instance (`instance_group.count` of them), calls `load` once, then
    `execute` from one worker thread at a time per instance (different instances run concurrently), and `unload`
    once at the end. Arrays are numpy; BYTES tensors are object arrays of `bytes`.

    `execute` gets a batch of requests -- each a dict of input name -> array, optional inputs possibly missing --
    and returns one dict of output name -> array per request, in order. When the model has `max_batch_size > 0`,
    every array of a request has a leading batch dimension (the request's own batch size). An entry may be an
    `Exception` instead of a dict: that request alone fails with the exception's message. Raising fails every
    request of the batch. Decoupled models (`spec.decoupled`) return, per request, an iterable of response dicts
    (zero or more), produced lazily if they like.
    """

    @abstractmethod
    def load(self, spec: Any) -> None:
        """Load the model for `spec` (an `engines.types.TensorModelSpec`); raise `ValueError` with a fix on bad
        files."""

    @abstractmethod
    def execute(self, requests: list[dict[str, Any]]) -> list[Any]:
        """Run one batch; see the class docstring for the shapes."""

    def unload(self) -> None:  # noqa: B027 - optional hook
        """Free resources."""

    def describe(self) -> dict[str, Any]:
        """Facts learned while loading, for the gateway: may hold `inputs`/`outputs` (lists of TensorSpec, to fill
        in a config that omits them), `max_model_len` and `vocab_size` (text models)."""
        return {}

    def batch_dimension(self, spec: Any) -> bool:
        """Before `load`, for a config that omits `max_batch_size`: whether the model file's tensors all start with a
        variable batch dimension (then the gateway sets Triton's default max_batch_size and dynamic batcher, as
        Triton's auto-complete does). Cheap: read the file's interface, not its weights. Default: unknown, False."""
        return False


class UpstreamError(Exception):
    """An upstream answered with an HTTP error. `message` is the upstream's own (shortened, never our credentials);
    `param`, `code` and `type` are its OpenAI error fields when it sent them; `retry_after` its Retry-After in
    seconds. The gateway maps it onto its own errors: a 400 stays the client's fault, a 5xx is a bad gateway."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        retry_after: float | None = None,
    ) -> None:  # noqa: A002 - OpenAI's name
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type
        self.retry_after = retry_after


class UpstreamUnreachableError(EngineUnavailableError):
    """The upstream could not be reached, or dropped the connection before its answer was complete."""


class UpstreamTimeoutError(EngineUnavailableError):
    """The upstream took longer than the configured timeout to connect or to send the next piece of its answer."""


class PassthroughEngine(ABC):
    """An OpenAI-compatible upstream used as it is: the gateway hands it request bodies, it answers with bodies.

    No tokenizer and no `GenerationRequest`: the upstream renders its own chat template and counts its own tokens,
    so anything OpenAI-compatible can serve (Ollama, LM Studio, llama.cpp's server, vLLM, a cloud API). The gateway
    checks the request and its routes, admits it, then calls `request` (a JSON answer) or `stream` (the SSE
    chunks, parsed); `endpoint` is the path under `/v1` (`chat/completions`, `completions`, `embeddings`) and
    `body` the client's body with `model` already set to the upstream's name.

    Errors: `UpstreamError` for an HTTP error answer, `UpstreamUnreachableError` and `UpstreamTimeoutError` for a
    transport failure, before the first chunk or at any point after it.
    """

    @property
    @abstractmethod
    def info(self) -> EngineInfo:
        """The model's facts as far as they are known (`max_model_len` 0 when the upstream does not say it)."""

    @property
    @abstractmethod
    def upstream_model(self) -> str:
        """The name the upstream serves the model under (what `body["model"]` is set to)."""

    @abstractmethod
    async def request(self, endpoint: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        """POST `body` to the upstream's `/v1/<endpoint>` and return its JSON answer."""

    @abstractmethod
    def stream(self, endpoint: str, body: dict[str, Any], headers: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        """POST a streaming `body` and yield each `data:` chunk of the answer, parsed, until `[DONE]`. Closing the
        iterator closes the upstream connection, which stops the generation there."""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open the connection pool (on the event loop). Called once."""

    async def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Close the connection pool. Called once when the model is unloaded."""
