"""Fixtures of the residency tests (residency_harness.py): the hand-moved clock, and the controls to close."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.repository.model_control import ModelControl
from tests.gateway.repository.residency_harness import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def started() -> AsyncIterator[list[ModelControl]]:
    """Controls to start (prepare, load startup models, start) and close after the test."""
    controls: list[ModelControl] = []
    yield controls
    for control in controls:
        await control.close()
        for model in control.models.all_models():
            await model.stop()
