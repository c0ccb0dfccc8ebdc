"""A batch's statuses and the moves between them, OpenAI's:

    validating -> in_progress -> finalizing -> completed
    validating -> failed                      (the input file is not a valid batch)
    validating | in_progress -> cancelling -> cancelled
    validating | in_progress -> expired      (not done within the completion window)
    any status not terminal -> failed         (the server could not go on: its error is in `errors`)

Each status but `validating` stamps its `<status>_at` time once. A batch in a terminal status never moves again;
a batch that is not yet terminal when the server stops resumes from its status at the next start.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidRequestError

TERMINAL = frozenset({"completed", "failed", "cancelled", "expired"})
MOVES: dict[str, frozenset[str]] = {
    "validating": frozenset({"in_progress", "failed", "cancelling", "expired"}),
    "in_progress": frozenset({"finalizing", "cancelling", "expired", "failed"}),
    "finalizing": frozenset({"completed", "failed"}),
    "cancelling": frozenset({"cancelled", "failed"}),
    **{status: frozenset() for status in TERMINAL},
}
STATUSES = tuple(MOVES)
CANCELLABLE = frozenset({"validating", "in_progress"})


class InvalidTransition(RuntimeError):
    """A move the state machine does not allow: a bug in the runner, never the client's doing."""


def advance(batch: dict[str, Any], status: str, now: int) -> None:
    """Move `batch` (the Batch object) to `status`, stamping `<status>_at`."""
    current = batch["status"]
    if status not in MOVES.get(current, frozenset()):
        raise InvalidTransition(f"batch {batch.get('id')} cannot move from {current} to {status}")
    batch["status"] = status
    batch[f"{status}_at"] = now


def check_cancellable(batch: dict[str, Any]) -> bool:
    """Whether cancelling has anything to do: True for a running batch, False when it is already cancelling or
    cancelled (cancelling again is a no-op, as on OpenAI); 400 for a batch that is finishing or has ended."""
    status = batch["status"]
    if status in CANCELLABLE:
        return True
    if status in ("cancelling", "cancelled"):
        return False
    raise InvalidRequestError(f"Cannot cancel a batch with status '{status}'.", param="batch_id")
