"""A bounded priority queue of requests in front of an upstream used as it is (passthrough.py): at most
`max_num_seqs` requests in at once, the others waiting in (priority, arrival) order with aging, at most
`max_queue_size` of them (429 beyond). The admission scheduler of engines that batch internally (admission.py) has
the fuller policy of overload control (timeouts, expected-wait shedding: queue_policy.py)."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass

from engines.types import GenerationRequest
from gateway.errors import RateLimitError
from gateway.repository.model_config import SchedulerConfig
from gateway.scheduler.llm.interface import admission_key


@dataclass
class _Ticket:
    request: GenerationRequest
    order: int
    granted: asyncio.Future[None]

    def sort_key(self, now: float, aging_seconds: float) -> tuple[float, int]:
        return admission_key(self.request, self.order, now, aging_seconds)


class AdmissionQueue:
    """At most `max_num_seqs` requests in at once; the others wait in (priority, arrival) order with aging, at
    most `max_queue_size` of them (429 beyond). Shared by the schedulers of engines that batch internally and of
    upstreams used as they are (passthrough.py)."""

    def __init__(self, limits: SchedulerConfig) -> None:
        self._limits = limits
        self._waiting: list[_Ticket] = []
        self._slots_used = 0
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def check_room(self) -> None:
        if len(self._waiting) >= self._limits.max_queue_size:
            raise RateLimitError("the model's queue is full; retry shortly", headers={"Retry-After": "1"})

    def fail_waiting(self, error: BaseException) -> None:
        for ticket in self._waiting:
            if not ticket.granted.done():
                ticket.granted.set_exception(error)
        self._waiting.clear()

    async def acquire(self, request: GenerationRequest) -> None:
        if self._slots_used < self._limits.max_num_seqs and not self._waiting:
            self._slots_used += 1
            return
        ticket = _Ticket(request, next(self._order), asyncio.get_running_loop().create_future())
        self._waiting.append(ticket)
        try:
            await ticket.granted
        except BaseException:
            if ticket in self._waiting:
                self._waiting.remove(ticket)
            elif ticket.granted.done() and not ticket.granted.cancelled() and ticket.granted.exception() is None:
                self.release()  # granted a slot in the same tick the caller went away: hand it on
            raise

    def release(self) -> None:
        self._slots_used -= 1
        self._dispatch()

    def _dispatch(self) -> None:
        now = time.monotonic()
        aging = self._limits.aging_seconds
        while self._waiting and self._slots_used < self._limits.max_num_seqs:
            ticket = min(self._waiting, key=lambda t: t.sort_key(now, aging))
            self._waiting.remove(ticket)
            if ticket.granted.done():  # its caller gave up already
                continue
            self._slots_used += 1
            ticket.granted.set_result(None)
