"""What a named key may do, and the key as it is stored.

A key's policy: the models it may use (served names or aliases, with `*` patterns; none listed = every model),
requests and tokens per minute, a token budget (and optionally a cost budget) per calendar period in UTC, the
priority its requests get in the schedulers, and an expiry. Only the SHA-256 digest of a key's secret is stored;
the secret is shown once, when the key is created or rotated. Secrets carry 256 random bits, so a plain digest
cannot be reversed by guessing (password stretching would only slow every request down).
"""

from __future__ import annotations

import calendar
import hashlib
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

SECRET_PREFIX = "sk-sy-"
SHOWN_PREFIX_CHARS = 12  # how much of a secret the API shows to tell keys apart ("sk-sy-AbCdEf")
MAX_METADATA_ENTRIES = 32
MAX_METADATA_CHARS = 256

Status = Literal["active", "expired", "revoked"]


class KeyPolicy(BaseModel):
    """The limits of one key. `None` for `rpm`/`tpm` means the server-wide --rate-limit-rpm/--rate-limit-tpm; 0 means
    no limit; `None` for a budget means no budget."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: tuple[str, ...] = Field((), max_length=256, description="model names or aliases, `*` patterns; () = all")
    rpm: int | None = Field(None, ge=0, description="requests per minute")
    tpm: int | None = Field(None, ge=0, description="prompt + completion tokens per minute")
    budget_tokens: int | None = Field(None, ge=0, description="prompt + completion tokens per budget period")
    budget_cost: float | None = Field(None, ge=0, description="cost per budget period, in the unit of --key-price")
    budget_period: Literal["day", "month"] = Field("month", description="calendar day or month, in UTC")
    priority: int = Field(0, ge=-1000, le=1000, description="added to each request's priority; lower runs first")
    expires_at: int | None = Field(None, ge=0, description="Unix time after which the key is refused")

    @field_validator("models")
    @classmethod
    def _names(cls, models: tuple[str, ...]) -> tuple[str, ...]:
        for name in models:
            if not name or len(name) > 256 or not name.isprintable():
                raise ValueError("each model must be a name or pattern of 1 to 256 printable characters")
        return models

    def allows(self, model: str) -> bool:
        """Whether a request may name `model` (matched against each pattern, case-sensitively)."""
        return not self.models or any(fnmatchcase(model, pattern) for pattern in self.models)


POLICY_FIELDS = frozenset(KeyPolicy.model_fields)


def check_metadata(metadata: dict[str, str]) -> dict[str, str]:
    """Team, user and the like: a few short strings (they are listed with the key and its usage)."""
    if len(metadata) > MAX_METADATA_ENTRIES:
        raise ValueError(f"metadata holds at most {MAX_METADATA_ENTRIES} entries")
    for name, value in metadata.items():
        if not name or len(name) > 64 or len(value) > MAX_METADATA_CHARS:
            raise ValueError(f"metadata names are 1 to 64 characters, values at most {MAX_METADATA_CHARS}")
    return metadata


class KeyCreate(KeyPolicy):
    """The body of POST /admin/keys: a name, metadata and the policy's fields."""

    name: str = Field(min_length=1, max_length=128)
    metadata: dict[str, str] = Field(default_factory=dict)

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, metadata: dict[str, str]) -> dict[str, str]:
        return check_metadata(metadata)

    def policy(self) -> KeyPolicy:
        return KeyPolicy(**self.model_dump(include=set(POLICY_FIELDS)))


class KeyUpdate(BaseModel):
    """The body of PATCH /admin/keys/{id}: only the fields given change (null resets a limit to its default)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, min_length=1, max_length=128)
    metadata: dict[str, str] | None = None
    models: tuple[str, ...] | None = None
    rpm: int | None = None
    tpm: int | None = None
    budget_tokens: int | None = None
    budget_cost: float | None = None
    budget_period: Literal["day", "month"] | None = None
    priority: int | None = None
    expires_at: int | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        return metadata if metadata is None else check_metadata(metadata)

    def apply(self, policy: KeyPolicy) -> KeyPolicy:
        """`policy` with the given fields changed, checked as a whole (a ValidationError names a bad field)."""
        changes = {name: getattr(self, name) for name in self.model_fields_set & POLICY_FIELDS}
        for name in ("models", "budget_period", "priority"):  # these have no "default" to reset to with null
            if name in changes and changes[name] is None:
                del changes[name]
        return KeyPolicy.model_validate({**policy.model_dump(), **changes})


@dataclass
class KeyRecord:
    """A named key as stored: its digest, never its secret."""

    id: str
    name: str
    secret_hash: str
    prefix: str
    policy: KeyPolicy
    metadata: dict[str, str] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0
    revoked_at: float | None = None

    def status(self, now: float) -> Status:
        if self.revoked_at is not None:
            return "revoked"
        if self.policy.expires_at is not None and now >= self.policy.expires_at:
            return "expired"
        return "active"

    def public(self, now: float) -> dict[str, Any]:
        """The key as the admin API shows it (no digest, no secret)."""
        return {
            "id": self.id,
            "object": "api_key",
            "name": self.name,
            "prefix": self.prefix,
            "status": self.status(now),
            "created_at": int(self.created_at),
            "updated_at": int(self.updated_at),
            "revoked_at": int(self.revoked_at) if self.revoked_at is not None else None,
            **self.policy.model_dump(mode="json"),
            "metadata": self.metadata,
        }


def new_key_id() -> str:
    return "key_" + secrets.token_hex(8)


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def secret_digest(secret: str) -> str:
    """The stored form of a secret (hex SHA-256): what `auth.KeyStore` computes for every presented key."""
    return hashlib.sha256(secret.encode()).hexdigest()


def period_bounds(period: Literal["day", "month"], now: float) -> tuple[float, float]:
    """The UTC calendar day or month holding `now`, as Unix times [start, end)."""
    moment = datetime.fromtimestamp(now, UTC)
    if period == "day":
        start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        return start.timestamp(), start.timestamp() + 86400.0
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    days = calendar.monthrange(start.year, start.month)[1]
    return start.timestamp(), start.timestamp() + days * 86400.0
