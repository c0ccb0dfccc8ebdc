"""Usage per key and model: counted in memory on the event loop, written to the database in batches.

`add` is a few dict updates (it runs for every token step of every keyed request); `flush` swaps the pending
counts out and writes them in one transaction in a worker thread, then reads back each budgeted key's total for
its current period, which includes what other replicas sharing the database have written. What a budget check
sees is that total plus what this process has counted since: `used` never waits for the database. A failed write
keeps its counts for the next flush (nothing is lost while the database is away).

The ledger also keeps cumulative counts since the process started, per key and model, for /metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gateway.keys.policy import KeyRecord, period_bounds
from gateway.keys.store import UsageCounts, hour_of

log = logging.getLogger("switchyard.keys")


@dataclass(frozen=True)
class Price:
    """Cost per million tokens of one model: prompt (input), completion (output), and cached prompt tokens."""

    prompt: float
    completion: float
    cached: float

    @classmethod
    def parse(cls, text: str) -> tuple[str, Price]:
        """`MODEL=PROMPT:COMPLETION[:CACHED]` (per million tokens; cached defaults to the prompt price)."""
        model, sep, prices = text.rpartition("=")
        parts = prices.split(":")
        try:
            if not sep or not model or len(parts) not in (2, 3):
                raise ValueError
            numbers = [float(p) for p in parts]
            if any(n < 0 or n != n for n in numbers):
                raise ValueError
        except ValueError:
            raise ValueError(
                f"--key-price {text[:80]!r} must be MODEL=PROMPT:COMPLETION[:CACHED], prices per "
                "million tokens (e.g. smollm2-135m-instruct=0.1:0.4)"
            ) from None
        return model, cls(numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else numbers[0])

    def cost(self, prompt: int, cached: int, completion: int) -> float:
        """Cached tokens are part of `prompt`: they cost the cached price instead of the prompt price."""
        return ((prompt - cached) * self.prompt + cached * self.cached + completion * self.completion) / 1e6


#: Writes (key id, model, hour) -> counts and returns the period totals of key id -> period start: (tokens, cost).
Writer = Callable[[dict[tuple[str, str, int], UsageCounts], dict[str, float]], dict[str, tuple[int, float]]]


class UsageLedger:
    """Usage counted on the event loop and written by `flush` (see the module docstring)."""

    def __init__(
        self, write: Writer, prices: dict[str, Price] | None = None, wall: Callable[[], float] = time.time
    ) -> None:
        self._write = write  # blocking: runs in a worker thread
        self.prices = prices or {}
        self._wall = wall
        self._pending: dict[tuple[str, str, int], UsageCounts] = {}  # (key id, model, hour) -> not yet written
        self._unflushed: dict[str, list[float]] = {}  # key id -> [tokens, cost] in _pending
        self._writing: dict[str, list[float]] = {}  # key id -> [tokens, cost] being written now
        self._persisted: dict[str, tuple[float, int, float]] = {}  # key id -> (period start, tokens, cost) read back
        self.totals: dict[tuple[str, str], UsageCounts] = {}  # (key id, model) -> since this process started
        self.refusals: dict[tuple[str, str], int] = {}  # (key id, reason) -> refused requests, for /metrics
        self._flushing = asyncio.Lock()

    def add(
        self,
        key_id: str,
        model: str,
        *,
        requests: int = 0,
        errors: int = 0,
        prompt: int = 0,
        cached: int = 0,
        completion: int = 0,
    ) -> None:
        """Count usage of `key_id` on `model` now (cheap: called per generation step)."""
        price = self.prices.get(model)
        cost = price.cost(prompt, cached, completion) if price is not None else 0.0
        slot = (key_id, model, hour_of(self._wall()))
        pending = self._pending.get(slot)
        if pending is None:
            pending = self._pending[slot] = UsageCounts()
        pending.bump(requests, errors, prompt, cached, completion, cost)
        total = self.totals.get((key_id, model))
        if total is None:
            total = self.totals[(key_id, model)] = UsageCounts()
        total.bump(requests, errors, prompt, cached, completion, cost)
        if prompt or completion or cost:
            spent = self._unflushed.setdefault(key_id, [0, 0.0])
            spent[0] += prompt + completion
            spent[1] += cost

    def refused(self, key_id: str, reason: str) -> None:
        self.refusals[(key_id, reason)] = self.refusals.get((key_id, reason), 0) + 1

    def used(self, key: KeyRecord) -> tuple[int, float]:
        """Tokens and cost of `key` in its current budget period, as far as this process knows now."""
        start = period_bounds(key.policy.budget_period, self._wall())[0]
        persisted = self._persisted.get(key.id)
        tokens, cost = (persisted[1], persisted[2]) if persisted is not None and persisted[0] == start else (0, 0.0)
        for local in (self._writing.get(key.id), self._unflushed.get(key.id)):
            if local is not None:
                tokens += int(local[0])
                cost += local[1]
        return tokens, cost

    async def flush(self, keys: Iterable[KeyRecord] = ()) -> None:
        """Write the pending counts, then read back the period totals of the budgeted `keys`."""
        async with self._flushing:
            rows, self._pending = self._pending, {}
            self._writing, self._unflushed = self._unflushed, {}
            now = self._wall()
            starts = {
                k.id: period_bounds(k.policy.budget_period, now)[0]
                for k in keys
                if k.policy.budget_tokens is not None or k.policy.budget_cost is not None
            }
            try:
                totals = await asyncio.to_thread(self._write, rows, starts)
            except Exception as exc:  # the database is away: keep the counts for the next flush
                log.warning("could not write key usage (%s: %s); retrying at the next flush", type(exc).__name__, exc)
                for slot, counts in rows.items():
                    if slot in self._pending:
                        self._pending[slot].add(counts)
                    else:
                        self._pending[slot] = counts
                for key_id, (tokens, cost) in self._writing.items():
                    spent = self._unflushed.setdefault(key_id, [0, 0.0])
                    spent[0] += tokens
                    spent[1] += cost
                self._writing = {}
                return
            self._persisted = {key_id: (start, *totals.get(key_id, (0, 0.0))) for key_id, start in starts.items()}
            self._writing = {}
