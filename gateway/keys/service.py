"""Named keys at run time: found by digest for every request, admitted by their limits, changed by the admin API.

The keys live in the database and in memory here: lookups never touch the database. A background task writes
usage every --key-usage-flush-secs and re-reads the keys every --key-refresh-secs, so a key created, changed or
revoked through another replica sharing the database takes effect here within that time (at once on the replica
that made the change). Per-minute limits are counted in each process; budgets add up every replica's usage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from gateway.errors import (
    AuthenticationError,
    ConfigError,
    InvalidRequestError,
    NotFoundError,
    QuotaExceededError,
    RateLimitError,
)
from gateway.keys.limits import KeyLimiter
from gateway.keys.policy import (
    SHOWN_PREFIX_CHARS,
    KeyCreate,
    KeyRecord,
    KeyUpdate,
    new_key_id,
    new_secret,
    secret_digest,
)
from gateway.keys.store import KeyDatabase, UsageCounts
from gateway.keys.usage import Price, UsageLedger

log = logging.getLogger("switchyard.keys")


class KeyService:
    """Named keys for the access checks (lookup by digest, admission, token charges) and for the admin API
    (changes, written to the database first). `wall` is the clock of expiry and budget periods (tests inject one)."""

    def __init__(
        self,
        open_db: Callable[[], KeyDatabase],
        limiter: KeyLimiter,
        prices: dict[str, Price] | None = None,
        *,
        flush_secs: float = 5.0,
        refresh_secs: float = 10.0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._open_db = open_db
        self.db: KeyDatabase | None = None
        self.limiter = limiter
        self.ledger = UsageLedger(self._write_usage, prices, wall)
        self.flush_secs = flush_secs
        self.refresh_secs = refresh_secs
        self._wall = wall
        self._by_hash: dict[str, KeyRecord] = {}
        self._by_id: dict[str, KeyRecord] = {}
        self._any_live = False
        self._changes = 0  # changes made here: a refresh read before one of them must not undo it
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def open(self) -> None:
        """Open the database (off the event loop), read the keys and their budgets' usage, start the writer."""
        self.db = await asyncio.to_thread(self._open_db)
        self._index(await asyncio.to_thread(self.db.keys))
        await self.ledger.flush(self._by_id.values())
        self._task = asyncio.create_task(self._background(), name="switchyard-key-usage")
        if self._any_live:
            log.info("%d named API keys in the key store: inference needs an API key", len(self._by_id))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.db is not None:
            await self.ledger.flush()  # the last counts
            self.db.close()
            self.db = None

    async def _background(self) -> None:
        last_refresh = time.monotonic()
        while True:
            await asyncio.sleep(self.flush_secs)
            try:
                if time.monotonic() - last_refresh >= self.refresh_secs:
                    last_refresh = time.monotonic()
                    assert self.db is not None
                    changes = self._changes
                    keys = await asyncio.to_thread(self.db.keys)
                    if changes == self._changes:  # else a change made meanwhile may be missing: read next time
                        self._index(keys)
                await self.ledger.flush(self._by_id.values())
            except Exception:  # the database is away: keep serving with the keys already read
                log.exception("could not refresh the named keys")

    def _write_usage(
        self, rows: dict[tuple[str, str, int], UsageCounts], starts: dict[str, float]
    ) -> dict[str, tuple[int, float]]:
        if self.db is None:
            raise RuntimeError("the key store is closed")
        self.db.add_usage(rows)
        return self.db.period_totals(starts) if starts else {}

    def _index(self, keys: list[KeyRecord]) -> None:
        self._by_id = {k.id: k for k in keys}
        self._by_hash = {k.secret_hash: k for k in keys}
        self._any_live = any(k.revoked_at is None for k in keys)
        for key in keys:
            if key.revoked_at is not None:
                self.limiter.forget(key.id)

    def _put(self, key: KeyRecord, old_hash: str | None = None) -> None:
        """One key changed on this replica: index it now."""
        if old_hash is not None:
            self._by_hash.pop(old_hash, None)
        self._changes += 1
        self._by_id[key.id] = key
        self._by_hash[key.secret_hash] = key
        self._any_live = any(k.revoked_at is None for k in self._by_id.values())

    # ------------------------------------------------------------------ requests

    def now(self) -> float:
        """Unix time by the service's clock (injectable in tests)."""
        return self._wall()

    @property
    def has_keys(self) -> bool:
        """Whether any key is not revoked: then inference needs a key (see auth.KeyStore.inference_open)."""
        return self._any_live

    def authenticate(self, digest: str) -> KeyRecord | None:
        """The key whose secret has this hex SHA-256 digest; None if no named key has it; AuthenticationError (401)
        for a revoked or expired key."""
        key = self._by_hash.get(digest)
        if key is None:
            return None
        status = key.status(self._wall())
        if status == "revoked":
            raise AuthenticationError("This API key has been revoked.")
        if status == "expired":
            raise AuthenticationError("This API key has expired; ask an administrator for a new one.")
        return key

    def admit(self, key: KeyRecord) -> None:
        """Count a request of `key`, or 429 (its budget or a per-minute limit)."""
        try:
            used_tokens, used_cost = self.ledger.used(key)
            self.limiter.admit(key, used_tokens, used_cost, self._wall())
        except QuotaExceededError:
            self.ledger.refused(key.id, "budget")
            raise
        except RateLimitError:
            self.ledger.refused(key.id, "rate_limit")
            raise

    def charge(
        self, key: KeyRecord, model: str, prompt: int, cached: int, completion: int, in_flight: bool = True
    ) -> None:
        self.ledger.add(key.id, model, prompt=prompt, cached=cached, completion=completion)
        self.limiter.charge(key.id, prompt + completion, in_flight)

    def release(self, key: KeyRecord, tokens: int, sample: bool = True) -> None:
        """A request of `key` admitted by `admit` ended (see KeyLimiter.release)."""
        self.limiter.release(key.id, tokens, sample)

    # ------------------------------------------------------------------ the admin API

    def keys(self) -> list[KeyRecord]:
        return list(self._by_id.values())

    def get(self, key_id: str) -> KeyRecord:
        key = self._by_id.get(key_id)
        if key is None:
            raise NotFoundError(f"no API key with id '{key_id[:64]}'", param="key_id", code="key_not_found")
        return key

    def named(self, id_or_name: str) -> list[KeyRecord]:
        """The keys an id or a name designates (several keys may share a name)."""
        key = self._by_id.get(id_or_name)
        return [key] if key is not None else [k for k in self._by_id.values() if k.name == id_or_name]

    async def _fresh(self, key_id: str) -> KeyRecord:
        """The key as the database has it now (another replica may have changed it)."""
        assert self.db is not None
        key = await asyncio.to_thread(self.db.get, key_id)
        if key is None:
            raise NotFoundError(f"no API key with id '{key_id[:64]}'", param="key_id", code="key_not_found")
        return key

    async def create(self, body: KeyCreate) -> tuple[KeyRecord, str]:
        """A new key and its secret (shown this once)."""
        assert self.db is not None
        secret, now = new_secret(), self._wall()
        key = KeyRecord(
            new_key_id(),
            body.name,
            secret_digest(secret),
            secret[:SHOWN_PREFIX_CHARS],
            body.policy(),
            dict(body.metadata),
            now,
            now,
        )
        await asyncio.to_thread(self.db.insert, key)
        self._put(key)
        log.info("API key %s (%s) created", key.id, key.name)
        return key, secret

    async def update(self, key_id: str, body: KeyUpdate) -> KeyRecord:
        assert self.db is not None
        key = await self._fresh(key_id)
        key.policy = body.apply(key.policy)
        if body.name is not None:
            key.name = body.name
        if body.metadata is not None:
            key.metadata = dict(body.metadata)
        key.updated_at = self._wall()
        await asyncio.to_thread(self.db.save, key)
        self._put(key, old_hash=key.secret_hash)
        return key

    async def rotate(self, key_id: str) -> tuple[KeyRecord, str]:
        """A new secret for the key (same id, policy and usage); the old secret stops working now."""
        assert self.db is not None
        key = await self._fresh(key_id)
        if key.revoked_at is not None:
            raise InvalidRequestError(
                f"API key '{key_id[:64]}' is revoked and cannot be rotated; create a new key",
                param="key_id",
                code="key_revoked",
            )
        old_hash, secret = key.secret_hash, new_secret()
        key.secret_hash, key.prefix, key.updated_at = secret_digest(secret), secret[:SHOWN_PREFIX_CHARS], self._wall()
        await asyncio.to_thread(self.db.save, key)
        self._put(key, old_hash=old_hash)
        log.info("API key %s (%s) rotated", key.id, key.name)
        return key, secret

    async def revoke(self, key_id: str) -> KeyRecord:
        """Refuse the key from now on (401); it stays listed, with its usage."""
        assert self.db is not None
        key = await self._fresh(key_id)
        if key.revoked_at is None:
            key.revoked_at = key.updated_at = self._wall()
            await asyncio.to_thread(self.db.save, key)
            log.info("API key %s (%s) revoked", key.id, key.name)
        self._put(key)
        self.limiter.forget(key.id)
        return key


def open_key_service(
    path: Path,
    url: str | None,
    *,
    default_rpm: int,
    default_tpm: int,
    prices: tuple[str, ...],
    flush_secs: float,
    refresh_secs: float,
) -> KeyService:
    """The service for the server's settings; the database opens with `KeyService.open` (in the app's startup)."""
    try:
        parsed = dict(Price.parse(text) for text in prices)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return KeyService(
        lambda: KeyDatabase.open(path, url),
        KeyLimiter(default_rpm, default_tpm),
        parsed,
        flush_secs=flush_secs,
        refresh_secs=refresh_secs,
    )
