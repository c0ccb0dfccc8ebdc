"""A LoRA adapter as a served model: the base model's scheduler with every request run under the adapter.

Every frontend (OpenAI, Anthropic, KServe generate) looks a model up by name and calls its scheduler, so an
adapter needs nothing of its own beyond this view: its requests go into the base model's batches (rows of many
adapters and of the base model share each step), with `GenerationRequest.adapter` set. The view counts them, so
that an unload waits for them (adapter_catalog.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from engines.interface import Tokenizer
from engines.types import AdapterRef, EngineInfo, GenerationOutput, GenerationRequest
from gateway.errors import ModelNotFoundError
from gateway.llm.grammar_compiler import GuidedDecoder
from gateway.llm.parsers import ModelParsers
from gateway.llm.template_support import TemplateSupport
from gateway.repository.loaded_model import LoadedLLM
from gateway.repository.serving import InFlight, ServingScheduler
from gateway.scheduler.llm.interface import LLMEngine, LLMScheduler, SchedulerStats


@dataclass
class ServedAdapter:
    """One loaded adapter: what requests carry (`ref`), the path it was given as (shown as its card's `root`), and
    the requests running under it."""

    ref: AdapterRef
    given_path: str
    created: int = field(default_factory=lambda: int(time.time()))
    in_flight: int = 0
    closed: bool = False  # unloading: no new request starts under it


class AdapterScheduler(LLMScheduler):
    """The base model's scheduler, each request under `adapter`. Stats, sessions and health are the base model's."""

    def __init__(self, base: ServingScheduler, adapter: ServedAdapter) -> None:
        self.base, self.adapter = base, adapter

    @property
    def info(self) -> EngineInfo:
        return self.base.info

    @property
    def tokenizer(self) -> Tokenizer:
        return self.base.tokenizer

    @property
    def engine(self) -> LLMEngine:
        return self.base.engine

    @property
    def in_flight(self) -> InFlight:
        return self.base.in_flight

    async def start(self) -> None:
        """The base model's scheduler runs already."""

    async def stop(self) -> None:
        """The base model stops its scheduler."""

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        request.adapter = self.adapter.ref
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        adapter = self.adapter
        if adapter.closed:
            raise ModelNotFoundError(f"{adapter.ref.name} (the LoRA adapter was unloaded)")
        adapter.in_flight += 1
        try:
            async with contextlib.aclosing(self.base.generate(request)) as stream:
                async for out in stream:
                    yield out
        finally:
            adapter.in_flight -= 1

    def stats(self) -> SchedulerStats:
        return self.base.stats()

    def delete_session(self, session_id: str) -> bool:
        return self.base.delete_session(session_id)

    @property
    def healthy(self) -> bool:
        return self.base.healthy


@dataclass(kw_only=True)
class LoadedAdapter(LoadedLLM):
    """An adapter served as a model of its own: the base model's config and folder, its own name and scheduler."""

    parent: LoadedLLM
    adapter: ServedAdapter

    @classmethod
    def of(cls, base: LoadedLLM, adapter: ServedAdapter) -> LoadedAdapter:
        return cls(
            name=f"{base.name}:{adapter.ref.name}",
            config=base.config,
            scheduler=AdapterScheduler(base.scheduler, adapter),  # type: ignore[arg-type]
            folder=base.folder,
            created=adapter.created,
            parent=base,
            adapter=adapter,
        )

    @property
    def template_support(self) -> TemplateSupport:
        return self.parent.template_support  # the base model's template

    @property
    def parsers(self) -> ModelParsers:
        return self.parent.parsers  # the base model's config and template

    @property
    def grammar(self) -> GuidedDecoder:
        return self.parent.grammar  # the base model's tokenizer, so its compiled grammars serve every adapter

    def named(self, name: str) -> LoadedAdapter:
        """The same adapter served under `name` (its bare name)."""
        return LoadedAdapter(
            name=name,
            config=self.config,
            scheduler=self.scheduler,
            folder=self.folder,
            created=self.created,
            parent=self.parent,
            adapter=self.adapter,
        )

    async def start(self) -> None:
        """Nothing to start: the base model runs."""

    async def stop(self) -> None:
        """Nothing to stop: the catalog drops the adapter (adapter_catalog.py)."""
