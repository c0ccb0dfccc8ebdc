"""The usage ledger: cheap counts in memory, batched writes, budgets that see unwritten and other replicas' usage,
nothing lost while the database is away, and prices."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.keys.policy import KeyPolicy, KeyRecord
from gateway.keys.store import KeyDatabase, UsageCounts
from gateway.keys.usage import Price, UsageLedger

NOON = datetime(2026, 3, 10, 12, 0, tzinfo=UTC).timestamp()


def budgeted(key_id: str = "key_1") -> KeyRecord:
    return KeyRecord(key_id, key_id, "d-" + key_id, "p", KeyPolicy(budget_tokens=1000, budget_period="day"))


def writer(db: KeyDatabase):  # noqa: ANN201 - the ledger's Writer
    def write(rows: dict, starts: dict) -> dict:
        db.add_usage(rows)
        return db.period_totals(starts) if starts else {}

    return write


async def test_usage_is_counted_at_once_and_written_in_one_batch(tmp_path: Path) -> None:
    db = KeyDatabase.open(tmp_path / "k.sqlite3")
    ledger = UsageLedger(writer(db), wall=lambda: NOON)
    key = budgeted()
    ledger.add(key.id, "m", requests=1)
    for _ in range(10):
        ledger.add(key.id, "m", completion=3)
    ledger.add(key.id, "m", prompt=20, cached=16)
    assert ledger.used(key) == (50, 0.0)  # not yet written, already counted
    assert db.usage_rows(None, None, None, None) == []
    await ledger.flush([key])
    [(_, _, _, counts)] = db.usage_rows(None, None, None, None)
    assert (counts.requests, counts.prompt_tokens, counts.cached_tokens, counts.completion_tokens) == (1, 20, 16, 30)
    assert ledger.used(key) == (50, 0.0)  # now read back from the database, not counted twice
    ledger.add(key.id, "m", completion=5)
    assert ledger.used(key) == (55, 0.0)


async def test_budgets_include_what_other_replicas_wrote(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    mine, theirs = KeyDatabase.open(path), KeyDatabase.open(path)
    key = budgeted()
    theirs.add_usage({(key.id, "m", int(NOON)): UsageCounts(prompt_tokens=300, completion_tokens=400)})
    theirs.add_usage({(key.id, "m", int(NOON) - 86400): UsageCounts(prompt_tokens=999)})  # yesterday: not counted
    ledger = UsageLedger(writer(mine), wall=lambda: NOON)
    await ledger.flush([key])
    ledger.add(key.id, "m", prompt=1)
    assert ledger.used(key) == (701, 0.0)


async def test_a_failed_write_keeps_its_counts_for_the_next_flush(tmp_path: Path) -> None:
    db = KeyDatabase.open(tmp_path / "k.sqlite3")
    down = True

    def flaky(rows: dict, starts: dict) -> dict:
        if down:
            raise OSError("database unreachable")
        return writer(db)(rows, starts)

    ledger = UsageLedger(flaky, wall=lambda: NOON)
    key = budgeted()
    ledger.add(key.id, "m", requests=1, prompt=7)
    await ledger.flush([key])
    assert ledger.used(key) == (7, 0.0)
    ledger.add(key.id, "m", completion=3)
    down = False
    await ledger.flush([key])
    [(_, _, _, counts)] = db.usage_rows(None, None, None, None)
    assert (counts.requests, counts.prompt_tokens, counts.completion_tokens) == (1, 7, 3)
    assert ledger.used(key) == (10, 0.0)


def test_prices_turn_tokens_into_cost() -> None:
    model, price = Price.parse("gpt-4o-mini=0.15:0.6:0.075")
    assert model == "gpt-4o-mini" and price.cost(1_000_000, 0, 1_000_000) == pytest.approx(0.75)
    assert price.cost(1_000_000, 1_000_000, 0) == pytest.approx(0.075)  # cached prompt tokens cost less
    assert Price.parse("org/model=1:2")[1].cached == 1.0
    for bad in ("model", "model=1", "model=a:b", "=1:2", "m=-1:2"):
        with pytest.raises(ValueError, match="MODEL=PROMPT:COMPLETION"):
            Price.parse(bad)
    ledger = UsageLedger(lambda rows, starts: {}, {"m": price}, wall=lambda: NOON)
    ledger.add("key_1", "m", prompt=1_000_000, completion=1_000_000)
    ledger.add("key_1", "m", cached=1_000_000)  # learned when the request finishes: lowers its cost
    assert ledger.totals[("key_1", "m")].cost == pytest.approx(0.675)
