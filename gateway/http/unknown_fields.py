"""Unknown request fields are accepted and logged, never refused: clients send other servers' extras."""

from __future__ import annotations

import logging

from pydantic import BaseModel

log = logging.getLogger("switchyard")


def log_unknown(body: BaseModel, route: str) -> None:
    """Say which fields of a request were accepted but not read."""
    if body.model_extra:
        log.info("%s: ignoring unknown fields %s", route, sorted(body.model_extra)[:20])
