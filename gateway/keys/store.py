"""Named keys and their usage in a database: an SQLite file by default, or any SQLAlchemy URL (PostgreSQL, for
replicas that share their keys and budgets).

Two tables: `switchyard_keys` (one row per key: its digest, never its secret; revoked keys stay, so their usage
keeps a name) and `switchyard_key_usage` (counts per key, model and UTC hour, added to in place). Every call is
blocking and short: callers run them off the event loop (`asyncio.to_thread`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Engine
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from gateway.errors import ConfigError
from gateway.keys.policy import KeyPolicy, KeyRecord

log = logging.getLogger("switchyard.keys")

HOUR = 3600
COUNTS = ("requests", "errors", "prompt_tokens", "cached_tokens", "completion_tokens", "cost")

_schema = MetaData()
KEYS = Table(
    "switchyard_keys",
    _schema,
    Column("id", String(32), primary_key=True),
    Column("name", String(128), nullable=False),
    Column("secret_hash", String(64), nullable=False, unique=True),
    Column("prefix", String(16), nullable=False),
    Column("policy", Text, nullable=False),  # KeyPolicy as JSON: new policy fields need no migration
    Column("metadata", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("revoked_at", Float, nullable=True),
)
USAGE = Table(
    "switchyard_key_usage",
    _schema,
    Column("key_id", String(32), primary_key=True),
    Column("model", String(256), primary_key=True),
    Column("hour", BigInteger, primary_key=True),  # Unix time of the UTC hour's start
    *(Column(name, BigInteger, nullable=False, default=0) for name in COUNTS[:-1]),
    Column("cost", Float, nullable=False, default=0.0),
)


@dataclass
class UsageCounts:
    """What a key did with a model: requests (errors among them) and tokens (cached ones are part of the prompt)."""

    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0

    def add(self, other: UsageCounts) -> None:
        for name in COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def bump(self, requests: int, errors: int, prompt: int, cached: int, completion: int, cost: float) -> None:
        """`add` without building a second object (the hot path: once per generation step)."""
        self.requests += requests
        self.errors += errors
        self.prompt_tokens += prompt
        self.cached_tokens += cached
        self.completion_tokens += completion
        self.cost += cost

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in COUNTS} | {"total_tokens": self.total_tokens}


def hour_of(when: float) -> int:
    return int(when // HOUR * HOUR)


def _record(row: Any) -> KeyRecord | None:
    try:
        policy = KeyPolicy.model_validate_json(row.policy)
    except ValidationError as exc:  # written by another release: the key is refused rather than misread
        log.warning("key %s has a policy this release cannot read (%s); it is ignored", row.id, exc.errors()[0])
        return None
    return KeyRecord(
        row.id,
        row.name,
        row.secret_hash,
        row.prefix,
        policy,
        json.loads(row.metadata),
        row.created_at,
        row.updated_at,
        row.revoked_at,
    )


class KeyDatabase:
    """The keys and usage tables behind one SQLAlchemy engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        _schema.create_all(engine)

    @classmethod
    def open(cls, path: Path, url: str | None = None) -> KeyDatabase:
        """The database at `url`, else the SQLite file `path` (WAL, so readers never wait for the usage writer)."""
        if url is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(f"sqlite:///{path}")

            @event.listens_for(engine, "connect")
            def _pragmas(connection: Any, _record: Any) -> None:
                cursor = connection.cursor()
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA busy_timeout=5000")  # several servers may share one file
                cursor.close()
        else:
            try:
                engine = create_engine(url, pool_pre_ping=True)
            except (ArgumentError, ImportError) as exc:  # the URL may hold a password: never quote it
                why = f"its driver is not installed ({exc})" if isinstance(exc, ImportError) else "it does not parse"
                raise ConfigError(
                    f"cannot use SWITCHYARD_KEY_STORE_URL: {why}; give a SQLAlchemy URL such as "
                    "postgresql+psycopg://user@host/db and install its driver"
                ) from None
        try:
            return cls(engine)
        except SQLAlchemyError as exc:
            raise ConfigError(
                f"cannot open the key store ({type(exc).__name__}); check --key-store or "
                "SWITCHYARD_KEY_STORE_URL and that the database is reachable"
            ) from None

    def close(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------------ keys

    def keys(self) -> list[KeyRecord]:
        """Every key, revoked ones included, oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(KEYS).order_by(KEYS.c.created_at, KEYS.c.id)).all()
        return [r for r in map(_record, rows) if r is not None]

    def get(self, key_id: str) -> KeyRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(KEYS).where(KEYS.c.id == key_id)).first()
        return None if row is None else _record(row)

    def insert(self, key: KeyRecord) -> None:
        with self.engine.begin() as conn:
            conn.execute(KEYS.insert().values(**self._row(key)))

    def save(self, key: KeyRecord) -> None:
        """Write every field of an existing key (a policy change, a rotation, a revocation)."""
        with self.engine.begin() as conn:
            conn.execute(update(KEYS).where(KEYS.c.id == key.id).values(**self._row(key)))

    @staticmethod
    def _row(key: KeyRecord) -> dict[str, Any]:
        return {
            "id": key.id,
            "name": key.name,
            "secret_hash": key.secret_hash,
            "prefix": key.prefix,
            "policy": key.policy.model_dump_json(),
            "metadata": json.dumps(key.metadata),
            "created_at": key.created_at,
            "updated_at": key.updated_at,
            "revoked_at": key.revoked_at,
        }

    # ------------------------------------------------------------------ usage

    def add_usage(self, rows: dict[tuple[str, str, int], UsageCounts]) -> None:
        """Add counts per (key id, model, hour) in one transaction: an upsert on SQLite and PostgreSQL."""
        if not rows:
            return
        values = [{"key_id": k, "model": m, "hour": h, **c.as_dict()} for (k, m, h), c in rows.items()]
        for value in values:
            del value["total_tokens"]
        with self.engine.begin() as conn:
            dialect = self.engine.dialect.name
            if dialect in ("sqlite", "postgresql"):
                stmt = (sqlite_insert if dialect == "sqlite" else postgresql_insert)(USAGE)
                stmt = stmt.on_conflict_do_update(
                    index_elements=[USAGE.c.key_id, USAGE.c.model, USAGE.c.hour],
                    set_={name: USAGE.c[name] + stmt.excluded[name] for name in COUNTS},
                )
                conn.execute(stmt, values)
                return
            for value in values:  # other databases: update, else insert
                where = (
                    (USAGE.c.key_id == value["key_id"])
                    & (USAGE.c.model == value["model"])
                    & (USAGE.c.hour == value["hour"])
                )
                done = conn.execute(
                    update(USAGE).where(where).values({name: USAGE.c[name] + value[name] for name in COUNTS})
                ).rowcount
                if not done:
                    conn.execute(USAGE.insert().values(**value))

    def usage_rows(
        self, key_ids: Sequence[str] | None, model: str | None, start: float | None, end: float | None
    ) -> list[tuple[str, str, int, UsageCounts]]:
        """(key id, model, hour, counts) for the hours overlapping [start, end), oldest first."""
        query = select(USAGE)
        if key_ids is not None:
            query = query.where(USAGE.c.key_id.in_(list(key_ids)))
        if model is not None:
            query = query.where(USAGE.c.model == model)
        if start is not None:
            query = query.where(USAGE.c.hour >= hour_of(start))
        if end is not None:
            query = query.where(USAGE.c.hour < end)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(USAGE.c.hour, USAGE.c.key_id, USAGE.c.model)).all()
        return [(r.key_id, r.model, r.hour, UsageCounts(*(getattr(r, n) for n in COUNTS))) for r in rows]

    def period_totals(self, starts: dict[str, float]) -> dict[str, tuple[int, float]]:
        """Tokens (prompt + completion) and cost of each key since its period's start (`starts`: key id -> start)."""
        by_start: dict[float, list[str]] = {}
        for key_id, start in starts.items():
            by_start.setdefault(start, []).append(key_id)
        totals: dict[str, tuple[int, float]] = {}
        with self.engine.connect() as conn:
            for start, key_ids in by_start.items():
                for chunk in _chunks(key_ids, 500):
                    query = (
                        select(
                            USAGE.c.key_id,
                            func.sum(USAGE.c.prompt_tokens + USAGE.c.completion_tokens),
                            func.sum(USAGE.c.cost),
                        )
                        .where(USAGE.c.key_id.in_(chunk), USAGE.c.hour >= hour_of(start))
                        .group_by(USAGE.c.key_id)
                    )
                    for key_id, tokens, cost in conn.execute(query):
                        totals[key_id] = (int(tokens or 0), float(cost or 0.0))
        return totals


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for at in range(0, len(items), size):
        yield items[at : at + size]
