"""The batch status machine: OpenAI's moves and timestamps, nothing else; cancelling is allowed while a batch
runs, a no-op once cancelling, and a 400 when it is finishing or over."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.batch.states import MOVES, STATUSES, TERMINAL, InvalidTransition, advance, check_cancellable
from gateway.errors import InvalidRequestError


def _batch(status: str = "validating") -> dict[str, Any]:
    return {"id": "batch_x", "status": status}


def test_the_happy_path_stamps_each_status() -> None:
    batch = _batch()
    for now, status in enumerate(("in_progress", "finalizing", "completed"), 100):
        advance(batch, status, now)
    assert batch == {
        "id": "batch_x",
        "status": "completed",
        "in_progress_at": 100,
        "finalizing_at": 101,
        "completed_at": 102,
    }


@pytest.mark.parametrize(
    "path",
    [
        ("failed",),
        ("cancelling", "cancelled"),
        ("expired",),
        ("in_progress", "cancelling", "cancelled"),
        ("in_progress", "expired"),
        ("in_progress", "failed"),
        ("in_progress", "finalizing", "failed"),
    ],
)
def test_every_allowed_path_reaches_a_terminal_status(path: tuple[str, ...]) -> None:
    batch = _batch()
    for status in path:
        advance(batch, status, 1)
    assert batch["status"] in TERMINAL and batch[f"{path[-1]}_at"] == 1


@pytest.mark.parametrize(
    ("start", "target"),
    [
        ("validating", "finalizing"),
        ("validating", "completed"),
        ("in_progress", "validating"),
        ("in_progress", "completed"),
        ("finalizing", "cancelling"),
        ("cancelling", "in_progress"),
        ("cancelling", "completed"),
        *[(t, s) for t in sorted(TERMINAL) for s in STATUSES],
    ],
)
def test_other_moves_are_refused(start: str, target: str) -> None:
    batch = _batch(start)
    with pytest.raises(InvalidTransition):
        advance(batch, target, 1)
    assert batch == _batch(start)  # untouched


def test_every_status_has_its_moves() -> None:
    assert set(STATUSES) == {
        "validating",
        "failed",
        "in_progress",
        "finalizing",
        "completed",
        "expired",
        "cancelling",
        "cancelled",
    }
    assert all(MOVES[s] <= set(STATUSES) for s in STATUSES)


def test_cancel_rules() -> None:
    assert check_cancellable(_batch("validating")) and check_cancellable(_batch("in_progress"))
    assert not check_cancellable(_batch("cancelling")) and not check_cancellable(_batch("cancelled"))
    for status in ("finalizing", "completed", "failed", "expired"):
        with pytest.raises(InvalidRequestError, match=status):
            check_cancellable(_batch(status))
