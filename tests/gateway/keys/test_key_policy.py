"""Key policies: model patterns, checks of the admin API's bodies, partial updates, status and budget periods."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from gateway.keys.policy import (
    SECRET_PREFIX,
    KeyCreate,
    KeyPolicy,
    KeyRecord,
    KeyUpdate,
    new_secret,
    period_bounds,
    secret_digest,
)


def test_models_are_names_or_patterns_and_none_means_all() -> None:
    assert KeyPolicy().allows("anything")
    policy = KeyPolicy(models=("smollm2-135m-instruct", "gpt-4o-*"))
    assert policy.allows("smollm2-135m-instruct") and policy.allows("gpt-4o-mini")
    assert not policy.allows("SMOLLM2-135M-INSTRUCT")  # served names are case-sensitive
    assert not policy.allows("smollm2-135m") and not policy.allows("other")


@pytest.mark.parametrize(
    "bad",
    [
        {"rpm": -1},
        {"tpm": -5},
        {"budget_tokens": -1},
        {"budget_period": "week"},
        {"priority": 5000},
        {"models": [""]},
        {"unknown": 1},
    ],
)
def test_bad_policies_are_refused(bad: dict) -> None:
    with pytest.raises(ValidationError):
        KeyCreate(name="k", **bad)


def test_metadata_is_bounded() -> None:
    assert KeyCreate(name="k", metadata={"team": "search", "user": "ada"}).metadata["team"] == "search"
    with pytest.raises(ValidationError):
        KeyCreate(name="k", metadata={f"m{i}": "v" for i in range(33)})
    with pytest.raises(ValidationError):
        KeyCreate(name="k", metadata={"team": "x" * 300})


def test_an_update_changes_only_the_fields_given() -> None:
    policy = KeyCreate(name="k", models=["a"], rpm=10, tpm=1000, budget_tokens=5, priority=2).policy()
    changed = KeyUpdate(tpm=2000).apply(policy)
    assert (changed.models, changed.rpm, changed.tpm, changed.budget_tokens, changed.priority) == (
        ("a",),
        10,
        2000,
        5,
        2,
    )
    reset = KeyUpdate.model_validate({"rpm": None, "models": None}).apply(policy)
    assert reset.rpm is None and reset.models == ("a",)  # null resets a limit; lists and levels keep theirs
    with pytest.raises(ValidationError):
        KeyUpdate(rpm=-3).apply(policy)  # the result is checked as a whole


def test_status_follows_revocation_and_expiry() -> None:
    key = KeyRecord("key_1", "k", "h", "sk-sy-abc", KeyPolicy(expires_at=1000))
    assert key.status(999.0) == "active" and key.status(1000.0) == "expired"
    key.revoked_at = 500.0
    assert key.status(0.0) == "revoked"
    shown = key.public(0.0)
    assert "secret_hash" not in shown and shown["status"] == "revoked" and shown["expires_at"] == 1000


def test_secrets_are_random_and_stored_as_digests() -> None:
    a, b = new_secret(), new_secret()
    assert a != b and a.startswith(SECRET_PREFIX) and len(a) > 40
    assert secret_digest(a) != a and len(secret_digest(a)) == 64


def test_budget_periods_are_utc_calendar_days_and_months() -> None:
    moment = datetime(2026, 2, 14, 15, 30, tzinfo=UTC).timestamp()
    day = period_bounds("day", moment)
    assert day == (datetime(2026, 2, 14, tzinfo=UTC).timestamp(), datetime(2026, 2, 15, tzinfo=UTC).timestamp())
    month = period_bounds("month", moment)
    assert month == (datetime(2026, 2, 1, tzinfo=UTC).timestamp(), datetime(2026, 3, 1, tzinfo=UTC).timestamp())
    december = period_bounds("month", datetime(2026, 12, 31, 23, 59, tzinfo=UTC).timestamp())
    assert december[1] == datetime(2027, 1, 1, tzinfo=UTC).timestamp()
