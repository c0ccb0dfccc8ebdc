"""Triton's rate limiter (`--rate-limit execution_count`): model instances of every tensor model share named
resources, and an instance executes a batch only while it holds the resources its `instance_group[].rate_limiter`
lists; a busy model thus cannot starve the others of, say, memory or cores. (Not the per-key request limits of
`gateway/keys/rate_limit.py`.)

* Resources are global (`global: true`: one pool for the server) or per device (each device has its own pool; an
  instance draws on its device's pool; every instance runs on the CPU here, device 0). A resource's amount is
  `--rate-limit-resource NAME:COUNT[:DEVICE]`, or else the largest count any loaded instance asks for (Triton's
  default), so every instance can run on its own. An instance asking for more than a given amount fails to load.
* Order: instances waiting for resources are served by weighted fair queueing on `priority` (Triton's weighting:
  an instance with priority 2 gets half the turns of one with priority 1 while both wait; 0 counts as 1). The
  instance at the head waits until its resources are free; those behind it wait too, so the order holds.
* An instance that releases its resources with more work queued keeps its place for a moment (`HOLD_S`): it asks
  again within a few event-loop turns, and without that hold the other waiters would always be served first and
  priorities would not show under load.

All waiting happens on the event loop; the set of instances changes from loader threads under a lock.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import dataclass, field

from gateway.errors import ConfigError

HOLD_S = 0.02

ResourceKey = tuple[str, int | None]  # (name, device); device None = a global resource


@dataclass(frozen=True)
class ResourceLimit:
    """`--rate-limit-resource NAME:COUNT[:DEVICE]`: the amount of a resource (on one device, or on every device
    and globally when `device` is None)."""

    name: str
    count: int
    device: int | None = None

    @classmethod
    def parse(cls, text: str) -> ResourceLimit:
        parts = text.split(":")
        try:
            if len(parts) not in (2, 3) or not parts[0]:
                raise ValueError
            count = int(parts[1])
            device = int(parts[2]) if len(parts) == 3 else None
            if count < 0 or (device is not None and device < 0):
                raise ValueError
        except ValueError:
            raise ConfigError(
                f"--rate-limit-resource {text[:80]!r} must be NAME:COUNT or NAME:COUNT:DEVICE with "
                "non-negative integers (e.g. R1:4 or R1:4:0)"
            ) from None
        return cls(parts[0], count, device)


@dataclass
class _Waiter:
    gate: InstanceGate
    tag: float
    seq: int
    future: asyncio.Future[None] | None = None  # None: a held place (the instance will ask again)
    expires: float = 0.0


@dataclass(eq=False)
class InstanceGate:
    """One model instance's access to the limiter: `acquire` before executing a batch, `release` after."""

    limiter: RateLimiter
    owner: str
    needs: dict[ResourceKey, int]
    priority: int
    finish: float = 0.0  # weighted-fair-queueing finish tag of its latest turn
    holding: bool = False
    closed: bool = False
    waiting: list[_Waiter] = field(default_factory=list)

    async def acquire(self) -> int:
        """Wait until this instance's resources are free and take them; returns the nanoseconds waited."""
        return await self.limiter._acquire(self)

    def release(self, again: bool = False) -> None:
        """Give the resources back; `again`: more work is queued, so keep this instance's turn in line."""
        self.limiter._release(self, again)

    def close(self) -> None:
        """The instance is unloaded: forget its needs (the default amounts may shrink)."""
        self.limiter._close(self)


class RateLimiter:
    def __init__(self, limits: list[ResourceLimit] | tuple[ResourceLimit, ...] = ()) -> None:
        self._explicit = list(limits)
        self._gates: set[InstanceGate] = set()
        self._used: dict[ResourceKey, int] = {}
        self._queue: list[_Waiter] = []
        self._seq = itertools.count()
        self._vtime = 0.0
        self._lock = threading.Lock()
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ instances (loader threads)

    def gate(self, owner: str, resources: list[tuple[str, int, bool]], priority: int, device: int = 0) -> InstanceGate:
        """Register one instance needing `resources` ((name, count, global) each); ConfigError if an amount given
        on the command line is too small for it or a name is used both as global and per device."""
        needs: dict[ResourceKey, int] = {}
        for name, count, is_global in resources:
            key = (name, None if is_global else device)
            needs[key] = needs.get(key, 0) + count
        with self._lock:
            for (name, dev), count in needs.items():
                mixed = [k for g in self._gates for k in g.needs if k[0] == name and (k[1] is None) != (dev is None)]
                if mixed:
                    raise ConfigError(
                        f"rate limiter resource '{name}' is global for one model and per-device for "
                        "another; use the same 'global' setting everywhere"
                    )
                explicit = self._explicit_amount(name, dev)
                if explicit is not None and count > explicit:
                    where = "globally" if dev is None else f"on device {dev}"
                    raise ConfigError(
                        f"instance '{owner}' needs {count} of rate limiter resource '{name}', but "
                        f"--rate-limit-resource gives {explicit} {where}; raise it or lower the count"
                    )
            gate = InstanceGate(self, owner, needs, max(1, priority))
            self._gates.add(gate)
        return gate

    def _explicit_amount(self, name: str, device: int | None) -> int | None:
        exact = [r.count for r in self._explicit if r.name == name and r.device == device]
        if exact:
            return exact[-1]
        every = [r.count for r in self._explicit if r.name == name and r.device is None]
        return every[-1] if every else None

    def amount(self, key: ResourceKey) -> int:
        """How much of a resource there is: the command line's amount, else the largest single need."""
        explicit = self._explicit_amount(*key)
        if explicit is not None:
            return explicit
        return max((g.needs.get(key, 0) for g in self._gates), default=0)

    def snapshot(self) -> list[tuple[str, int | None, int, int]]:
        """(name, device, amount, in use) per resource, for /metrics."""
        with self._lock:
            keys = {k for g in self._gates for k in g.needs} | {k for k, n in self._used.items() if n}
            return [
                (name, dev, self.amount((name, dev)), self._used.get((name, dev), 0))
                for name, dev in sorted(keys, key=lambda k: (k[0], -1 if k[1] is None else k[1]))
            ]

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._queue if w.future is not None)

    # ------------------------------------------------------------------ waiting (event loop)

    def _fits(self, gate: InstanceGate, reserved: dict[ResourceKey, int] | None = None) -> bool:
        reserved = reserved or {}
        return all(
            self._used.get(key, 0) + reserved.get(key, 0) + count <= self.amount(key)
            for key, count in gate.needs.items()
        )

    def _take(self, gate: InstanceGate) -> None:
        for key, count in gate.needs.items():
            self._used[key] = self._used.get(key, 0) + count
        gate.holding = True

    def _tag(self, gate: InstanceGate) -> float:
        start = max(self._vtime, gate.finish)
        gate.finish = start + gate.priority
        return start

    async def _acquire(self, gate: InstanceGate) -> int:
        if gate.closed:
            raise RuntimeError(f"instance '{gate.owner}' is unloaded")
        if not gate.needs:
            return 0  # an instance that lists no resources never waits (nor holds up the line)
        arrived = time.monotonic_ns()
        loop = asyncio.get_running_loop()
        held = next((w for w in self._queue if w.gate is gate and w.future is None), None)
        if held is not None:
            waiter = held
            waiter.future = loop.create_future()
        else:
            waiter = _Waiter(gate, self._tag(gate), next(self._seq), loop.create_future())
            self._queue.append(waiter)
            self._queue.sort(key=lambda w: (w.tag, w.seq))
        with self._lock:
            self._dispatch()
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter in self._queue:
                self._queue.remove(waiter)
            elif waiter.future.done() and not waiter.future.cancelled():
                self._release(gate, False)  # granted while the caller was going away
            with self._lock:
                self._dispatch()
            raise
        return time.monotonic_ns() - arrived

    def _dispatch(self) -> None:
        """Grant resources down the line while they fit (call with the lock held). A held place keeps its
        resources reserved for its instance; the first real waiter that does not fit stops the line."""
        now = time.monotonic()
        self._queue = [w for w in self._queue if w.future is not None or w.expires > now]
        reserved: dict[ResourceKey, int] = {}
        earliest = None
        for waiter in list(self._queue):
            if waiter.future is None:  # a held place: its instance asks again in a moment
                for key, count in waiter.gate.needs.items():
                    reserved[key] = reserved.get(key, 0) + count
                earliest = waiter.expires if earliest is None else min(earliest, waiter.expires)
                continue
            if not self._fits(waiter.gate, reserved):
                break
            self._queue.remove(waiter)
            self._take(waiter.gate)
            self._vtime = max(self._vtime, waiter.tag)
            if not waiter.future.done():
                waiter.future.set_result(None)
        if earliest is not None:
            self._arm(earliest - now)

    def _arm(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(max(delay, 0.0), self._expire)

    def _expire(self) -> None:
        self._timer = None
        with self._lock:
            self._dispatch()

    def _release(self, gate: InstanceGate, again: bool) -> None:
        if not gate.holding or not gate.needs:
            return
        gate.holding = False
        for key, count in gate.needs.items():
            self._used[key] = self._used.get(key, 0) - count
        if again and not gate.closed:
            place = _Waiter(gate, self._tag(gate), next(self._seq), None, time.monotonic() + HOLD_S)
            self._queue.append(place)
            self._queue.sort(key=lambda w: (w.tag, w.seq))
        with self._lock:
            self._dispatch()

    def _close(self, gate: InstanceGate) -> None:
        gate.closed = True
        self._queue = [w for w in self._queue if w.gate is not gate or w.future is not None]
        with self._lock:
            self._gates.discard(gate)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # a failed load on a loader thread: nothing waits on this instance
        with self._lock:
            self._dispatch()
