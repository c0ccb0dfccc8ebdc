"""A model's admission queue in front of an engine that schedules its own steps: at most `max_num_seqs` requests
in at once, the others waiting in (priority, arrival) order with aging, under the overload policy of
queue_policy.py (a bounded queue, expected-wait shedding on arrival, per-request timeouts with Triton's
`timeout_action`, 429 with Retry-After).

Why one class: the schedulers of engines that batch internally (admission.py: vLLM, TensorRT-LLM, remote
upstreams) and of upstreams used as they are (passthrough.py: Ollama, llama-server, a cloud API) admit requests the
same way, so a model's `scheduler:` section means the same whatever serves it. The native engine's step scheduler
builds batches itself and applies the same QueuePolicy to its own waiting sequences.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass

from engines.types import GenerationRequest
from gateway.errors import ServiceUnavailableError
from gateway.repository.model_config import SchedulerConfig
from gateway.scheduler.llm.interface import SchedulerStats
from gateway.scheduler.llm.queue_policy import QueuePolicy


@dataclass
class _Ticket:
    request: GenerationRequest
    order: int
    granted: asyncio.Future[None]


class AdmissionQueue:
    """Slots and the requests waiting for one. `acquire` before a request enters the engine, `release` once it has
    left; `close` when the model stops."""

    def __init__(self, limits: SchedulerConfig) -> None:
        self._limits = limits
        self._policy = QueuePolicy(limits)
        self._waiting: list[_Ticket] = []
        self._slots_used = 0
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def record(self, stats: SchedulerStats) -> None:
        """Put the queue's figures in `stats`: its depth, its refusals by reason, the wait of a request arriving now."""
        stats.waiting = len(self._waiting)
        stats.rejected = self._policy.rejected
        stats.expected_wait_seconds = self._policy.expected_wait(len(self._waiting)) or 0.0

    async def acquire(self, request: GenerationRequest) -> None:
        """Return once `request` holds a slot. Raises OverloadedError (429 with Retry-After) when it is refused on
        arrival (the queue full, or its expected wait longer than its timeout) or, with `timeout_action: REJECT`,
        when it is still waiting at its timeout; ServiceUnavailableError (503) when the model stops meanwhile. The
        timeout counts from `request.arrival_time`, which the caller sets."""
        if self._slots_used < self._limits.max_num_seqs and not self._waiting:
            self._slots_used += 1
            return
        self._policy.admit(request, (t.request for t in self._waiting))
        ticket = _Ticket(request, next(self._order), asyncio.get_running_loop().create_future())
        self._waiting.append(ticket)
        self._policy.rate.update(time.monotonic(), len(self._waiting))
        try:
            timeout = self._policy.timeout(request)
            if timeout is not None:
                try:  # shielded: a timeout must not cancel a slot granted in the same tick
                    await asyncio.wait_for(asyncio.shield(ticket.granted), timeout)
                except TimeoutError:
                    if not ticket.granted.done():
                        error = self._policy.on_expired(request, len(self._waiting))
                        if error is not None:  # REJECT: leave the queue (below) and refuse
                            raise error from None
            await ticket.granted  # DELAY, or no timeout
        except BaseException:
            if ticket in self._waiting:
                self._waiting.remove(ticket)
                self._policy.rate.update(time.monotonic(), len(self._waiting))
            elif ticket.granted.done() and not ticket.granted.cancelled() and ticket.granted.exception() is None:
                self.release()  # granted a slot in the same tick the caller went away: hand it on
            raise
        finally:
            self._policy.forget(request.request_id)

    def release(self) -> None:
        """A request that held a slot has left the engine: admit the next waiting ones."""
        self._slots_used -= 1
        self._dispatch()

    def close(self) -> None:
        """The model stops: every waiting request is refused with 503 (the running ones are the caller's)."""
        for ticket in self._waiting:
            if not ticket.granted.done():
                ticket.granted.set_exception(
                    ServiceUnavailableError("the model was unloaded", headers={"Retry-After": "5"})
                )
        self._waiting.clear()

    def _dispatch(self) -> None:
        now = time.monotonic()
        admitted = 0
        while self._waiting and self._slots_used < self._limits.max_num_seqs:
            ticket = min(self._waiting, key=lambda t: self._policy.sort_key(t.request, t.order, now))
            self._waiting.remove(ticket)
            if ticket.granted.done():  # its caller gave up already
                continue
            self._slots_used += 1
            admitted += 1
            ticket.granted.set_result(None)
        self._policy.rate.update(now, len(self._waiting), admitted)
