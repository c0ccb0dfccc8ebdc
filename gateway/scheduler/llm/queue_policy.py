"""The LLM schedulers' queue policy: who may join a model's queue, how long a request may wait in it, and how long
it is expected to wait (Triton's ModelQueuePolicy, applied to LLM requests).

Why: with an unbounded queue, traffic beyond what a model serves makes every request wait longer than its client
will (goodput fell to 0.09x of the sustainable rate's at three times that rate, every request admitted). So:

* every request has a timeout: its own (`GenerationRequest.queue_timeout`, with `allow_timeout_override`) or the
  model's `scheduler.default_timeout_seconds` (0: none);
* a new request is refused at once (429 with Retry-After) when `max_queue_size` requests wait, or when its expected
  wait -- the requests ahead of it over the admission rate measured while requests were waiting -- is longer than
  its timeout: the queue holds what the model can start in time, whatever the model's speed;
* a request still waiting at its timeout is refused (REJECT, 429) or put behind every other one (DELAY);
* a request that started (admitted once, even if preempted since) is never timed out: overload refuses new work and
  never cuts a running stream.

The admission rate is an exponentially weighted ratio: admissions that left requests waiting (the model, not the
arrivals, limited them) over the time requests were left waiting. The schedulers report the queue after each
admission pass (the native engine's: after planning each step), so requests that arrived since the last pass and
are admitted at the next one are no backlog. Until requests have been left waiting for a second and a couple were
admitted meanwhile nothing is known, and only `max_queue_size` and the timeouts apply: a wrong guess then would
refuse requests the model could serve.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from engines.types import GenerationRequest
from gateway.errors import OverloadedError
from gateway.repository.model_config import SchedulerConfig
from gateway.scheduler.llm.interface import admission_key

REJECTED = "rejected"  # finish_reason of a request refused while waiting; the scheduler's stream raises instead
RATE_TIME_CONSTANT_S = 20.0  # how fast the admission rate forgets (an e-folding time)
MIN_BACKLOG_S = 1.0  # weighted seconds of waiting requests before the rate is trusted
MIN_ADMITTED = 2.0  # and weighted admissions among them
MAX_RETRY_AFTER_S = 60
# rejection reasons (the `reason` label of switchyard_requests_rejected_total)
QUEUE_FULL, EXPECTED_WAIT, QUEUE_TIMEOUT = "queue_full", "expected_wait", "queue_timeout"
REJECTION_REASONS = (QUEUE_FULL, EXPECTED_WAIT, QUEUE_TIMEOUT)


class AdmissionRate:
    """Requests admitted per second while requests were waiting: how fast a queue drains."""

    def __init__(self, time_constant_s: float = RATE_TIME_CONSTANT_S) -> None:
        self._tau = time_constant_s
        self._admitted = 0.0  # weighted admissions that left requests waiting
        self._backlog_s = 0.0  # weighted seconds with requests waiting
        self._since: float | None = None
        self._waiting = False

    def update(self, now: float, waiting: int, admitted: int = 0) -> None:
        """Call after each admission pass: `waiting` requests left waiting, `admitted` of them admitted by it."""
        if self._since is not None:
            decay = math.exp(-max(0.0, now - self._since) / self._tau)
            self._admitted *= decay
            self._backlog_s *= decay
            if self._waiting:
                self._backlog_s += self._tau * (1.0 - decay)  # the interval's seconds, weighted as the decay does
        self._since = now
        if admitted and waiting:
            self._admitted += admitted
        self._waiting = waiting > 0

    def per_second(self) -> float | None:
        """The rate, or None before the queue has held requests long enough to tell."""
        if self._backlog_s < MIN_BACKLOG_S or self._admitted < MIN_ADMITTED:
            return None
        return self._admitted / self._backlog_s


class QueuePolicy:
    """One model's queue policy; the scheduler calls it on arrival, on every queue change and each scheduling pass."""

    def __init__(self, config: SchedulerConfig) -> None:
        self._config = config
        self.rate = AdmissionRate()
        self.rejected: dict[str, int] = {}  # by reason
        self._delayed: set[str] = set()  # DELAY: past their timeout, behind every other request

    # -- timeouts -----------------------------------------------------------------------------------------------
    def timeout(self, request: GenerationRequest) -> float | None:
        """The request's admission timeout in seconds; None: it may wait as long as it takes."""
        seconds = self._config.default_timeout_seconds
        if request.queue_timeout is not None and self._config.allow_timeout_override:
            seconds = request.queue_timeout
        return seconds if seconds > 0 else None

    def expired(self, request: GenerationRequest, now: float) -> bool:
        """Whether a waiting request that never started is past its timeout (and not already delayed)."""
        limit = self.timeout(request)
        return limit is not None and now - request.arrival_time > limit and request.request_id not in self._delayed

    def on_expired(self, request: GenerationRequest, waiting: int) -> OverloadedError | None:
        """Apply `timeout_action` to an expired request: the error to end it with (REJECT), or None (DELAY: it
        stays, behind every other request)."""
        if self._config.timeout_action == "DELAY":
            self._delayed.add(request.request_id)
            return None
        limit = self.timeout(request) or 0.0
        return self._reject(
            QUEUE_TIMEOUT,
            f"the request waited {limit:g} s for the model without starting (its "
            "timeout); the model is overloaded: retry later or raise the timeout",
            self.expected_wait(waiting),
        )

    # -- arrivals -----------------------------------------------------------------------------------------------
    def admit(self, request: GenerationRequest, waiting: Iterable[GenerationRequest]) -> None:
        """Raise OverloadedError (429) when `request` should not join `waiting` (the requests queued now)."""
        queued = list(waiting)
        limit = self._config.max_queue_size
        if len(queued) >= limit:
            raise self._reject(
                QUEUE_FULL,
                f"the model's queue is full ({limit} requests waiting); retry later",
                self.expected_wait(len(queued)),
            )
        timeout = self.timeout(request)
        if timeout is None:
            return
        ahead = sum(1 for r in queued if r.priority <= request.priority and r.request_id not in self._delayed)
        wait = self.expected_wait(ahead)
        if wait is not None and wait > timeout:
            raise self._reject(
                EXPECTED_WAIT,
                f"the model is overloaded: {ahead} requests are ahead of this one, "
                f"about {wait:.1f} s of waiting, longer than its timeout of {timeout:g} s; retry later",
                wait - timeout,
            )

    def expected_wait(self, ahead: int) -> float | None:
        """Seconds until `ahead` waiting requests have been admitted; None while the rate is unknown."""
        if ahead <= 0:
            return 0.0
        rate = self.rate.per_second()
        if rate is None:
            return None
        return math.inf if rate <= 0 else ahead / rate

    # -- order --------------------------------------------------------------------------------------------------
    def sort_key(self, request: GenerationRequest, order: int, now: float) -> tuple[bool, float, int]:
        """Admission order: delayed requests last, then `admission_key` (priority, aging, arrival)."""
        return (request.request_id in self._delayed, *admission_key(request, order, now, self._config.aging_seconds))

    def forget(self, request_id: str) -> None:
        """The request left the queue for good (admitted, refused, gone)."""
        self._delayed.discard(request_id)

    def _reject(self, reason: str, message: str, wait: float | None) -> OverloadedError:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        return OverloadedError(message, reason=reason, retry_after=retry_after_seconds(wait))


def retry_after_seconds(wait: float | None) -> int:
    """Retry-After for a refusal: the expected wait past the timeout, in whole seconds, 1 to MAX_RETRY_AFTER_S."""
    if wait is None or math.isnan(wait):
        return 1
    if math.isinf(wait):
        return MAX_RETRY_AFTER_S
    return max(1, min(MAX_RETRY_AFTER_S, math.ceil(wait)))
