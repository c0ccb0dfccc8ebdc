"""One upstream server: where it is, how long to wait for it, whether it is alive, how busy we keep it.

Health is both active and passive. A background check asks every upstream `GET /health` (falling back to
`GET /v1/models` for servers without it) every `health_check_seconds`; a request that cannot connect, or gets a 503,
marks its upstream down at once, so the next request goes elsewhere without waiting for the next check. A down
upstream comes back when a check succeeds; while it stays down, its checks back off (the interval doubling after
each failed one, up to `health_backoff_max_seconds`), so a dead upstream is not hammered.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import aiohttp

log = logging.getLogger("switchyard.engines.remote")

# What a refused or broken connection or a silent upstream raises (aiohttp's read timeouts are TimeoutErrors).
TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError)


@dataclass(frozen=True)
class UpstreamSettings:
    """Where an upstream is and how long to wait for it.

    `url` is the server's base URL (`http://host:port`; a trailing `/v1` is accepted and dropped).
    `read_timeout` bounds the wait for each piece of a response, the first token included.
    """

    url: str
    connect_timeout: float = 5.0
    read_timeout: float = 600.0

    @property
    def base_url(self) -> str:
        url = self.url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url


class Upstream:
    def __init__(self, settings: UpstreamSettings) -> None:
        self.settings = settings
        self.base_url = settings.base_url
        self.outstanding = 0  # requests in flight on it from this gateway
        self.served = 0  # requests it has started answering (for stats and tests)
        self.healthy = True  # optimistic until the first check says otherwise
        self.last_error = ""
        self.down_since: float | None = None
        self.failed_checks = 0  # health checks failed in a row
        self.next_check = 0.0  # monotonic time before which a down upstream is not checked again (backoff)

    @property
    def timeout(self) -> aiohttp.ClientTimeout:
        """No bound on the whole response (a long generation is fine); each read waits at most `read_timeout`."""
        s = self.settings
        return aiohttp.ClientTimeout(total=None, connect=s.connect_timeout, sock_read=s.read_timeout)

    def mark_down(self, reason: str) -> None:
        if self.healthy:
            log.warning("upstream %s is down: %s", self.base_url, reason)
            self.down_since = time.monotonic()
        self.healthy = False
        self.last_error = reason

    def mark_up(self) -> None:
        if not self.healthy:
            log.info("upstream %s is back", self.base_url)
        self.healthy = True
        self.down_since = None
        self.failed_checks = 0
        self.next_check = 0.0

    def check_due(self, now: float) -> bool:
        """Whether the health loop checks this upstream now: always while it serves, else once its backoff ends."""
        return self.healthy or now >= self.next_check

    def back_off(self, now: float, interval: float, ceiling: float) -> float:
        """After a failed check: wait `interval` doubled per failure in a row, at most `ceiling`; the delay."""
        self.failed_checks += 1
        delay = min(ceiling, interval * 2.0 ** min(self.failed_checks - 1, 30))
        self.next_check = now + delay
        log.info(
            "upstream %s is still down after %d failed check(s) (%s); next check in %.1f s",
            self.base_url,
            self.failed_checks,
            self.last_error,
            delay,
        )
        return delay

    async def check(self, session: aiohttp.ClientSession, headers: dict[str, str]) -> bool:
        """Ask the upstream whether it serves; update `healthy`."""
        timeout = aiohttp.ClientTimeout(total=self.settings.connect_timeout + 2.0)
        try:
            status = await self._status(session, "/health", headers, timeout)
            if status == 404:  # servers without /health: a model list means it serves
                status = await self._status(session, "/v1/models", headers, timeout)
        except TRANSPORT_ERRORS as exc:
            self.mark_down(f"health check failed ({exc.__class__.__name__})")
            return False
        if status == 200:
            self.mark_up()
            return True
        self.mark_down(f"health check answered {status}")
        return False

    async def _status(
        self, session: aiohttp.ClientSession, path: str, headers: dict[str, str], timeout: aiohttp.ClientTimeout
    ) -> int:
        async with session.get(f"{self.base_url}{path}", headers=headers, timeout=timeout) as resp:
            await resp.read()  # so the connection can be reused
            return resp.status

    def __repr__(self) -> str:
        return f"Upstream({self.base_url}, healthy={self.healthy}, outstanding={self.outstanding})"
