"""The key service over a real SQLite store: create, rotate, update, revoke; lookups by digest; admission by
limits and budget; another replica's changes seen after a refresh."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.errors import AuthenticationError, InvalidRequestError, NotFoundError, QuotaExceededError
from gateway.keys.limits import KeyLimiter
from gateway.keys.policy import KeyCreate, KeyUpdate, secret_digest
from gateway.keys.service import KeyService
from gateway.keys.store import KeyDatabase


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def service(path: Path, wall: Clock) -> KeyService:
    return KeyService(
        lambda: KeyDatabase.open(path), KeyLimiter(clock=wall), flush_secs=3600, refresh_secs=3600, wall=wall
    )


async def test_keys_are_created_rotated_and_revoked(tmp_path: Path) -> None:
    wall = Clock(1_800_000_000.0)
    keys = service(tmp_path / "k.sqlite3", wall)
    await keys.open()
    try:
        assert not keys.has_keys
        key, secret = await keys.create(KeyCreate(name="search", models=["m"], metadata={"team": "search"}))
        assert keys.has_keys and key.prefix == secret[:12] and key.secret_hash == secret_digest(secret)
        assert keys.authenticate(secret_digest(secret)) is key
        assert keys.authenticate(secret_digest("sk-sy-unknown")) is None
        assert keys.named("search") == [key] and keys.named(key.id) == [key]
        stored = await asyncio.to_thread(lambda: b"".join(f.read_bytes() for f in tmp_path.glob("k.sqlite3*")))
        assert key.secret_hash.encode() in stored and secret.encode() not in stored  # the digest only

        rotated, new_secret = await keys.rotate(key.id)
        assert rotated.id == key.id and new_secret != secret
        assert keys.authenticate(secret_digest(secret)) is None  # the old secret stops working at once
        assert keys.authenticate(secret_digest(new_secret)).id == key.id

        changed = await keys.update(key.id, KeyUpdate(rpm=7, name="search-v2"))
        assert (changed.name, changed.policy.rpm, changed.policy.models) == ("search-v2", 7, ("m",))
        assert keys.authenticate(secret_digest(new_secret)).policy.rpm == 7

        await keys.revoke(key.id)
        with pytest.raises(AuthenticationError, match="revoked"):
            keys.authenticate(secret_digest(new_secret))
        assert not keys.has_keys and keys.get(key.id).status(wall.now) == "revoked"
        with pytest.raises(InvalidRequestError, match="revoked"):
            await keys.rotate(key.id)
        with pytest.raises(NotFoundError):
            await keys.revoke("key_missing")
    finally:
        await keys.close()


async def test_an_expired_key_is_refused(tmp_path: Path) -> None:
    wall = Clock(1_800_000_000.0)
    keys = service(tmp_path / "k.sqlite3", wall)
    await keys.open()
    try:
        _, secret = await keys.create(KeyCreate(name="temp", expires_at=int(wall.now) + 60))
        keys.authenticate(secret_digest(secret))
        wall.now += 60
        with pytest.raises(AuthenticationError, match="expired"):
            keys.authenticate(secret_digest(secret))
    finally:
        await keys.close()


async def test_a_budget_counts_usage_and_survives_a_restart(tmp_path: Path) -> None:
    path, wall = tmp_path / "k.sqlite3", Clock(1_800_000_000.0)
    keys = service(path, wall)
    await keys.open()
    key, _ = await keys.create(KeyCreate(name="small", budget_tokens=100, budget_period="month"))
    keys.admit(key)
    keys.charge(key, "m", 60, 0, 40)
    with pytest.raises(QuotaExceededError):
        keys.admit(key)
    await keys.close()  # writes the usage

    again = service(path, wall)
    await again.open()
    try:
        with pytest.raises(QuotaExceededError):
            again.admit(again.get(key.id))
        assert again.ledger.refusals == {(key.id, "budget"): 1}
        raised = await again.update(key.id, KeyUpdate(budget_tokens=1000))
        again.admit(raised)
    finally:
        await again.close()


async def test_another_replicas_keys_are_seen_after_a_refresh(tmp_path: Path) -> None:
    path, wall = tmp_path / "shared.sqlite3", Clock(1_800_000_000.0)
    one, two = service(path, wall), service(path, wall)
    one.flush_secs = two.flush_secs = 0.05
    one.refresh_secs = two.refresh_secs = 0.05
    await one.open()
    await two.open()
    try:
        key, secret = await one.create(KeyCreate(name="shared"))
        for _ in range(100):
            if two.authenticate(secret_digest(secret)) is not None:
                break
            await asyncio.sleep(0.05)
        assert two.authenticate(secret_digest(secret)).id == key.id
        await one.revoke(key.id)
        for _ in range(100):
            try:
                two.authenticate(secret_digest(secret))
            except AuthenticationError:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the revocation did not reach the other replica")
    finally:
        await one.close()
        await two.close()
