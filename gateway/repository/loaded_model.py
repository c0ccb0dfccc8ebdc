"""A served model as the frontends see it: an LLM behind its scheduler or a tensor model behind its batcher,
plus the hand-over a reload or an unload needs (stop new requests here, wait for the running ones)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway.repository.model_config import AnyModelConfig
from gateway.repository.serving import ServingScheduler
from gateway.scheduler.llm.interface import LLMScheduler


@dataclass
class LoadedModel:
    """A served model. `scheduler` is set for LLMs, `tensor` for tensor models (see `kind`)."""

    name: str
    config: AnyModelConfig
    scheduler: LLMScheduler | None = None
    tensor: Any = None  # gateway.kserve.model.TensorModel
    folder: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    load_seconds: float = 0.0  # how long loading took (nv_model_load_duration_secs)

    @property
    def kind(self) -> str:
        return "llm" if self.scheduler is not None else "tensor"

    @property
    def max_model_len(self) -> int | None:
        """Context length in tokens (LLMs, text encoders); None for models without one."""
        if self.scheduler is not None:
            return self.scheduler.info.max_model_len
        return self.tensor.describe().get("max_model_len") if self.tensor is not None else None

    @property
    def versions(self) -> list[int]:
        return sorted(self.tensor.versions) if self.tensor is not None else [1]

    async def start(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.start()
        if self.tensor is not None:
            await self.tensor.start()

    async def stop(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.stop()
        if self.tensor is not None:
            await self.tensor.stop()

    # ------------------------------------------------------------------ hand-over (reload, unload)

    def _gates(self) -> list[Any]:
        return [g for g in (getattr(self.scheduler, "in_flight", None), getattr(self.tensor, "in_flight", None))
                if g is not None]

    @property
    def in_flight(self) -> int:
        """Requests running on this copy (those that started after it was retired went to its successor)."""
        return sum(g.count for g in self._gates())

    def retire(self, successor: LoadedModel | None = None) -> None:
        """No new request starts here: with a successor (a reload) they go there, without one (unload) they get 503."""
        if isinstance(self.scheduler, ServingScheduler):
            self.scheduler.in_flight.retire(successor.scheduler if successor is not None else None)
        if self.tensor is not None and hasattr(self.tensor, "in_flight"):
            self.tensor.in_flight.retire(successor.tensor if successor is not None else None)

    async def wait_idle(self) -> None:
        for gate in self._gates():
            await gate.wait_idle()
