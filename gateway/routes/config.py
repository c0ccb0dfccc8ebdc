"""The routes file (`--routes FILE`, YAML): typed, checked when the server starts, every error naming the route,
the field and the fix.

```yaml
routes:
  gpt-4o-mini: smollm2-135m-instruct            # an alias
  chat:                                         # ordered fallbacks: a, then b, then c
    targets: [a, b, c]
    fallback_on: [connect, timeout, 5xx, 429]   # the default: every failure that is not the client's
    timeout_seconds: 30                         # per attempt, until the answer (a stream: its first chunk)
    retries: 2                                  # more attempts on the same model, for retry_on failures
    retry_on: [connect, 429]
    backoff: {initial_seconds: 0.25, multiplier: 2, max_seconds: 4, jitter: 0.2}
  canary:                                       # a weighted split; the others are the fallbacks
    strategy: weighted
    targets: [{model: stable, weight: 9}, {model: candidate, weight: 1}]
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gateway.errors import ConfigError

# Why an attempt failed, in the words `fallback_on` and `retry_on` take (policy.failure_reason decides):
# connect -- the model's upstream could not be reached or dropped the connection before answering;
# timeout -- no answer (a stream: no first chunk) within timeout_seconds, or the upstream's own timeout (504);
# 429 -- rate limited (the upstream's limit, or a full queue here); 5xx -- any other failure of the model (502, 503).
Reason = Literal["connect", "timeout", "429", "5xx"]
REASONS: tuple[Reason, ...] = ("connect", "timeout", "429", "5xx")
RETRY_DEFAULT: tuple[Reason, ...] = ("connect", "429")  # failures a retry on the same model may cure


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Target(_Strict):
    model: str = Field(min_length=1, max_length=256, description="A served model name.")
    weight: float = Field(1.0, gt=0, description="Share of first attempts (strategy: weighted).")


class Backoff(_Strict):
    """The wait before a retry: initial_seconds x multiplier^(retry - 1), at most max_seconds, spread by +-jitter
    (a fraction); an upstream's Retry-After, when longer, wins up to max_seconds."""

    initial_seconds: float = Field(0.25, ge=0)
    multiplier: float = Field(2.0, ge=1)
    max_seconds: float = Field(4.0, ge=0)
    jitter: float = Field(0.2, ge=0, le=1)


class Route(_Strict):
    targets: list[Target] = Field(min_length=1, max_length=32)
    strategy: Literal["ordered", "weighted"] = Field(
        "ordered",
        description="ordered: targets in their order; weighted: the first drawn by weight, the "
        "fallbacks after it drawn the same way from the rest.",
    )
    fallback_on: list[Reason] = Field(default_factory=lambda: list(REASONS))
    retries: int = Field(0, ge=0, le=10, description="More attempts on the same target for retry_on failures.")
    retry_on: list[Reason] = Field(default_factory=lambda: list(RETRY_DEFAULT))
    backoff: Backoff = Field(default_factory=Backoff)
    timeout_seconds: float | None = Field(None, gt=0)

    @field_validator("fallback_on", "retry_on", mode="before")
    @classmethod
    def _status_as_text(cls, value: Any) -> Any:
        """YAML reads `429` as a number; it is the reason `429`."""
        return (
            [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
            if isinstance(value, list)
            else value
        )

    @field_validator("targets", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        return [{"model": v} if isinstance(v, str) else v for v in value] if isinstance(value, list) else value

    @model_validator(mode="after")
    def _consistent(self) -> Route:
        names = [t.model for t in self.targets]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"targets name {', '.join(twice)} more than once; list each model once")
        if self.strategy == "ordered" and any(t.weight != 1.0 for t in self.targets):
            raise ValueError("weights are only read with strategy: weighted; add it or remove the weights")
        return self


class RoutesFile(_Strict):
    routes: dict[str, Route] = Field(default_factory=dict)

    @field_validator("routes", mode="before")
    @classmethod
    def _alias_shorthand(cls, value: Any) -> Any:
        """`alias: model` and `name: [a, b]` stand for `{targets: ...}`."""
        if not isinstance(value, dict):
            return value
        return {name: {"targets": spec} if isinstance(spec, (str, list)) else spec for name, spec in value.items()}

    @field_validator("routes")
    @classmethod
    def _names(cls, value: dict[str, Route]) -> dict[str, Route]:
        for name in value:
            if not name or len(name) > 256:
                raise ValueError(f"route name '{name[:40]}' must be 1 to 256 characters")
        return value


def load_routes(path: Path) -> RoutesFile:
    """Read and check a routes file; ConfigError says what to fix."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{path}: the routes file cannot be read ({exc.__class__.__name__}); check --routes."
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc.__class__.__name__}: {exc}). Fix the syntax.") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping with a `routes:` section.")
    try:
        return RoutesFile.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors()[:10]:
            where = ".".join(str(p) for p in err["loc"])
            msg = str(err["msg"]).removeprefix("Value error, ")
            hint = {
                "extra_forbidden": "remove it or check its spelling",
                "literal_error": "use one of the allowed values",
                "missing": "add it",
            }.get(err["type"], "correct the value")
            lines.append(f"  {where or '(top level)'}: {msg} -- {hint}")
        raise ConfigError(f"{path}: invalid routes:\n" + "\n".join(lines)) from None
