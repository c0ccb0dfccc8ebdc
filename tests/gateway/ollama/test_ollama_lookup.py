"""How an Ollama request takes its model (lookup.py `acquire`): through the registry's acquire, with the request's
keep_alive in the residency manager's terms (Ollama's "for ever" is a pin), and `name:latest` as the bare name."""

from __future__ import annotations

import math
from typing import cast

import pytest

from gateway.errors import ModelNotFoundError
from gateway.ollama.lookup import OllamaModelNotFoundError, acquire
from gateway.repository.lifecycle_config import FOREVER
from gateway.repository.registry import ModelRegistry


class Registry:
    """The registry's acquire, recording what it was asked; serves only `served`."""

    def __init__(self, served: str) -> None:
        self.served = served
        self.asked: list[tuple[str, float | None]] = []

    async def acquire(self, name: str, keep_alive: float | None = None) -> str:
        self.asked.append((name, keep_alive))
        if name != self.served:
            raise ModelNotFoundError(name)
        return name

    async def take(self, name: str, keep_alive: float | None = None) -> object:
        """lookup.acquire over this registry."""
        return await acquire(cast(ModelRegistry, self), name, keep_alive)


@pytest.mark.parametrize(("keep", "passed"), [(None, None), (0.0, 0.0), (300.0, 300.0), (math.inf, FOREVER)])
async def test_keep_alive_goes_to_acquire_in_residency_terms(keep: float | None, passed: float | None) -> None:
    registry = Registry("smol")
    assert await registry.take("smol", keep) == "smol"
    assert registry.asked == [("smol", passed)]


async def test_latest_is_tried_as_written_then_bare_and_unknown_is_ollamas_404() -> None:
    registry = Registry("smol")
    assert await registry.take("smol:latest", 60.0) == "smol"
    assert registry.asked == [("smol:latest", 60.0), ("smol", 60.0)]
    with pytest.raises(OllamaModelNotFoundError) as missing:
        await registry.take("nope:latest")
    assert missing.value.message == "model 'nope:latest' not found"
