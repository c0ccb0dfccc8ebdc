"""What a route did, in the response's headers: `x-switchyard-route`, `x-switchyard-model` (the model that
served), `x-switchyard-attempts` and `x-switchyard-fallbacks` (`model:reason, ...`). A pure ASGI middleware: it
gives each request a holder the route runner fills, and adds its headers when the response starts (a stream's
response starts after its first chunk, so after the route has settled)."""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.routes.runner import RouteOutcome, current_outcome


class RouteHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        holder: list[RouteOutcome] = []
        token = current_outcome.set(holder)

        async def send_with_route(message: Message) -> None:
            if message["type"] == "http.response.start" and holder:
                headers = MutableHeaders(scope=message)
                for key, value in holder[-1].headers().items():
                    headers[key] = value
            await send(message)

        try:
            await self.app(scope, receive, send_with_route)
        finally:
            current_outcome.reset(token)
