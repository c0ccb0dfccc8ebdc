"""HTTP requests by endpoint: one counter per (route, method, status), for every protocol on the HTTP port.

The endpoint is the route's template (`/v1/responses/{response_id}`), never the raw path, so ids in paths do not
multiply the series; a request refused before routing (401, 413, 429) is matched against the routes here, and
one that matches none counts as `unmatched`. Plain ints on the event loop; `metrics.py` reads them at
scrape time.
"""

from __future__ import annotations

from collections import Counter

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED = "unmatched"


class EndpointCounts:
    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str, str]] = Counter()  # (endpoint, method, status) -> requests


class EndpointCountMiddleware:
    def __init__(self, app: ASGIApp, counts: EndpointCounts) -> None:
        self.app = app
        self.counts = counts

    def _endpoint(self, scope: Scope) -> str:
        route = scope.get("route")
        if route is not None:
            return route.path
        app = scope.get("app")
        for candidate in getattr(app, "routes", ()):
            if candidate.matches(scope)[0] is Match.FULL:
                return candidate.path
        return UNMATCHED

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.counts.counts[(self._endpoint(scope), scope.get("method", ""), str(status))] += 1
