"""A served model as the frontends see it, in one of two kinds: an LLM behind its scheduler (`LoadedLLM`) or a
tensor model behind its batchers (`LoadedTensorModel`). Both carry the hand-over a reload or an unload needs (stop
new requests here, wait for the running ones); frontends tell them apart with `isinstance`, or ask the registry for
the kind they serve (`ModelRegistry.llm`, `ModelRegistry.tensor`)."""

from __future__ import annotations

import functools
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from engines.interface import AsyncGenerateEngine
from gateway.errors import NotFoundError
from gateway.llm.grammar_compiler import GuidedDecoder
from gateway.llm.parsers import ModelParsers, model_parsers
from gateway.llm.template_support import TemplateSupport, template_support, template_text
from gateway.observability.inference_stats import ModelStats
from gateway.repository.model_config import AnyModelConfig, ModelConfig
from gateway.repository.serving import InFlight, ServingScheduler
from gateway.repository.tensor_config import TensorModelConfig
from gateway.scheduler.llm.interface import LLMEngine
from gateway.tensor.model import TensorModel


@dataclass(kw_only=True)
class LoadedModel(ABC):
    """What every served model has: its served name, config, folder and how it hands over to a successor."""

    kind: ClassVar[str]
    name: str
    config: AnyModelConfig
    folder: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    load_seconds: float = 0.0  # how long loading took (nv_model_load_duration_secs)

    @property
    @abstractmethod
    def max_model_len(self) -> int | None:
        """Context length in tokens (LLMs, text encoders); None for models without one."""

    @property
    @abstractmethod
    def versions(self) -> list[int]:
        """The served version numbers."""

    @abstractmethod
    def version_number(self, version: str | int | None) -> int:
        """The served version `version` names ('' or None: the latest); 404 when it is not served."""

    @abstractmethod
    def version_stats(self) -> list[tuple[int, ModelStats, int]]:
        """(version, statistics, requests waiting) per served version, oldest first."""

    @property
    @abstractmethod
    def _gate(self) -> InFlight:
        """The counter of this copy's requests."""

    @abstractmethod
    def _hand_over(self, successor: LoadedModel | None) -> None:
        """Send new requests to `successor` (a reload), or refuse them (an unload)."""

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    # ------------------------------------------------------------------ hand-over (reload, unload)

    @property
    def in_flight(self) -> int:
        """Requests running on this copy (those that started after it was retired went to its successor)."""
        return self._gate.count

    def retire(self, successor: LoadedModel | None = None) -> None:
        """No new request starts here: with a successor (a reload) they go there, without one (unload) they get 503."""
        if successor is not None and type(successor) is not type(self):
            successor = None  # a reload that changed the model's kind: requests for the old kind cannot follow
        self._hand_over(successor)

    async def wait_idle(self) -> None:
        await self._gate.wait_idle()


class AdapterViews(Protocol):
    """A base model's LoRA adapters as served models (adapter_catalog.AdapterCatalog), as the registry looks them up."""

    def view(self, name: str, bare: bool = False) -> LoadedLLM | None:
        """Adapter `name` served as <model>:<name> (or, `bare`, as <name>); None when it is not loaded."""
        ...

    def views(self) -> Sequence[LoadedLLM]:
        """Every adapter, served as <model>:<adapter>."""
        ...


@dataclass(kw_only=True)
class LoadedLLM(LoadedModel):
    """An LLM: an engine behind its scheduler (for /v1 and v2 generate), and what serving it needs beside them,
    built once per model and held here: its chat template's support, its tool-call and reasoning parsers, its grammar
    compiler, its capabilities."""

    kind: ClassVar[str] = "llm"
    config: ModelConfig
    scheduler: ServingScheduler
    adapters: AdapterViews | None = None  # its LoRA adapters, where its engine serves them (AdapterCatalog)

    @property
    def engine(self) -> LLMEngine:
        return self.scheduler.engine

    @property
    def enforces_guided_spec(self) -> bool:
        """Whether the engine enforces `GuidedSpec`s itself (vLLM, remote) instead of applying our masks."""
        engine = self.engine
        return isinstance(engine, AsyncGenerateEngine) and engine.enforces_guided_spec

    @functools.cached_property
    def template_support(self) -> TemplateSupport:
        """What the chat template renders itself (tools, calls, results, a system turn): probed on first use; the
        builder asks once, off the event loop."""
        return template_support(self.scheduler.tokenizer)

    @functools.cached_property
    def parsers(self) -> ModelParsers:
        """Its tool-call dialect and reasoning parser (config, else chat template): chosen on first use; the builder
        asks once, when the model loads."""
        return model_parsers(self.config.parameters, template_text(self.scheduler.tokenizer))

    @functools.cached_property
    def grammar(self) -> GuidedDecoder:
        """The model's grammar compiler and its cache (llguidance loads on the first compile, so engines that
        enforce specs themselves never load it)."""
        info = self.scheduler.info
        return GuidedDecoder(self.scheduler.tokenizer, info.vocab_size, info.eos_token_ids)

    @property
    def max_model_len(self) -> int | None:
        return self.scheduler.info.max_model_len

    @property
    def versions(self) -> list[int]:
        return [1]

    def version_number(self, version: str | int | None) -> int:
        if version not in (None, "", 1, "1"):
            raise NotFoundError(f"model '{self.name}' has no version '{str(version)[:40]}'")
        return 1

    def version_stats(self) -> list[tuple[int, ModelStats, int]]:
        stats = self.scheduler.stats()
        return [(1, stats.requests.model_stats, stats.waiting)]

    @property
    def _gate(self) -> InFlight:
        return self.scheduler.in_flight

    def _hand_over(self, successor: LoadedModel | None) -> None:
        self.scheduler.in_flight.retire(successor.scheduler if isinstance(successor, LoadedLLM) else None)

    async def start(self) -> None:
        await self.scheduler.start()

    async def stop(self) -> None:
        await self.scheduler.stop()


@dataclass(kw_only=True)
class LoadedTensorModel(LoadedModel):
    """A tensor model: backend instances behind batchers (for v2 infer, /v1/embeddings and rerank)."""

    kind: ClassVar[str] = "tensor"
    config: TensorModelConfig
    tensor: TensorModel

    @property
    def max_model_len(self) -> int | None:
        return self.tensor.describe().get("max_model_len")

    @property
    def versions(self) -> list[int]:
        return sorted(self.tensor.versions)

    def version_number(self, version: str | int | None) -> int:
        return self.tensor.version(version).version

    def version_stats(self) -> list[tuple[int, ModelStats, int]]:
        return [
            (number, entry.stats, int(getattr(entry.batcher, "queued", 0)))
            for number, entry in sorted(self.tensor.versions.items())
        ]

    @property
    def _gate(self) -> InFlight:
        return self.tensor.in_flight

    def _hand_over(self, successor: LoadedModel | None) -> None:
        self.tensor.in_flight.retire(successor.tensor if isinstance(successor, LoadedTensorModel) else None)

    async def start(self) -> None:
        await self.tensor.start()

    async def stop(self) -> None:
        await self.tensor.stop()
