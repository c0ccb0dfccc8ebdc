"""A model's own lifecycle settings, in its config file beside the engine's: when it loads and how long it stays.

* `load: on_request` -- not loaded at startup; the first request for it loads it (while the request waits), in any
  control mode. `load: on_startup` loads it at startup even under `--model-control-mode=on_demand`. Unset: the
  control mode decides (on_demand: on request; none, poll, explicit: as Triton does).
* `keep_alive` -- how long the model stays loaded once idle (no request running) before it is unloaded, as
  Ollama's `keep_alive`: seconds (`300`), a duration (`5m`, `1h30m`, `90s`, `500ms`), `0` (unload as soon as the
  last request ends) or a negative value such as `-1` (never unloaded automatically: pinned). Unset: the server's
  `--keep-alive` for models loaded on request; models loaded at startup by Triton's modes stay loaded.

The same two fields are accepted in `config.yaml` and `config.pbtxt` (`load: "on_request"`, `keep_alive: "10m"`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field

LoadPolicy = Literal["on_startup", "on_request"]
#: A keep-alive that never expires (any negative value is normalised to this).
FOREVER = -1.0
_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|s|m|h)")
DURATION_HELP = (
    "use seconds (300), a duration such as 5m, 1h30m, 90s or 500ms, 0 to unload once idle, or -1 to keep "
    "the model loaded"
)


def parse_duration(value: Any) -> float:
    """Seconds from a number or a Go-style duration (`5m`, `1h30m`, `-1`); negative -> FOREVER. ValueError says the
    fix."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; {DURATION_HELP}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        try:
            seconds = sign * float(body)
        except ValueError:
            parts = _PART.findall(body)
            if not body or "".join(n + u for n, u in parts) != body:
                raise ValueError(f"{value[:40]!r} is not a duration; {DURATION_HELP}") from None
            seconds = sign * sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        raise ValueError(f"{type(value).__name__} is not a duration; {DURATION_HELP}")
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError(f"{value!r} is not a duration; {DURATION_HELP}")
    return FOREVER if seconds < 0 else seconds


#: A keep-alive in seconds, FOREVER (-1.0) for never.
KeepAlive = Annotated[float, BeforeValidator(parse_duration)]


def describe_keep_alive(seconds: float) -> str:
    """For logs and the console: `5m`, `90s`, `forever`."""
    if seconds < 0:
        return "forever"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 3600:g}h" if seconds % 3600 == 0 else f"{seconds / 60:g}m"
    return f"{seconds:g}s"


class LifecycleFields(BaseModel):
    """The lifecycle fields every model config has (LLM and tensor alike)."""

    load: LoadPolicy | None = Field(
        None,
        description="on_request: loaded by its first request; on_startup: loaded at startup; unset: the "
        "control mode decides.",
    )
    keep_alive: KeepAlive | None = Field(
        None,
        description="Idle time before the model unloads (300, 5m, 0, -1 = never); unset: --keep-alive for "
        "models loaded on request.",
    )
