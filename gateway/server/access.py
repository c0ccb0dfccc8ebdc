"""The checks every request passes before it reaches a handler: draining, canonical path, API key, rate limit.

`AccessControl` holds the policy for both protocols; `AccessMiddleware` applies it to HTTP (errors answered here,
in the protocol's own shape, so a refused request never reaches a handler) and `kserve/grpc_access.py` to gRPC.
Admitted HTTP requests are counted in flight until their response is fully sent, which is what a drain waits for.
A named key (gateway/keys/) is admitted by its own limits and budget, and bound to the request for the code that
runs it (model access, priority, usage); the response's status tells its usage whether the request failed.
CORS preflights are answered by the CORS middleware outside this one, without a key, as browsers expect.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import ANTHROPIC_PATHS, AuthenticationError, ServiceUnavailableError, SwitchyardError
from gateway.http.body_limit import send_error
from gateway.keys import context as key_context
from gateway.keys.auth import ANONYMOUS, KeyStore, Principal, Role, canonical_path
from gateway.keys.context import KeyAccount
from gateway.keys.rate_limit import RateLimiter, bind_caller
from gateway.keys.service import KeyService
from gateway.server.lifecycle import Lifecycle


class AccessControl:
    def __init__(
        self, keys: KeyStore, limiter: RateLimiter, lifecycle: Lifecycle, named: KeyService | None = None
    ) -> None:
        self.keys = keys
        self.limiter = limiter
        self.lifecycle = lifecycle
        self.named = named

    def admit(self, role: Role, authorization: str | None, client_address: str) -> Principal:
        """The caller, if a request of `role` may start now; else the SwitchyardError to answer with."""
        if role is Role.PUBLIC:
            return ANONYMOUS
        if self.lifecycle.draining:
            raise ServiceUnavailableError(
                "the server is shutting down; retry on another replica", headers={"Retry-After": "5"}
            )
        principal = self.keys.authorize(role, authorization)
        if principal.key is not None and self.named is not None:  # a named key: its own limits, not the server's
            self.named.admit(principal.key)
            key_context.bind(KeyAccount(principal.key, self.named))
        elif self.limiter.enabled and not principal.admin:  # operators are not throttled by their own limits
            caller = f"ip:{client_address}" if principal is ANONYMOUS else f"key:{principal.key_id}"
            self.limiter.admit(caller)
            bind_caller(self.limiter, caller)
        return principal


class AccessMiddleware:
    def __init__(self, app: ASGIApp, access: AccessControl) -> None:
        self.app = app
        self.access = access

    def _admit(self, scope: Scope) -> Role:
        path = canonical_path(scope.get("raw_path", b""), scope.get("path", ""))
        role = self.access.keys.role_of(path)
        headers = dict(scope.get("headers", []))
        authorization = headers.get(b"authorization")
        if authorization is None and b"x-api-key" in headers and path.startswith(ANTHROPIC_PATHS):
            authorization = b"Bearer " + headers[b"x-api-key"]  # how Anthropic's clients send the key
        client = scope.get("client") or ("unknown", 0)
        principal = self.access.admit(
            role, authorization.decode("latin-1") if authorization is not None else None, client[0]
        )
        scope.setdefault("state", {})["principal"] = principal  # handlers read it as request.state.principal
        return role

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            role = self._admit(scope)
        except SwitchyardError as error:
            if isinstance(error, AuthenticationError):
                error.headers.setdefault("WWW-Authenticate", "Bearer")
            await send_error(scope, send, error)
            return
        if role is Role.PUBLIC:
            await self.app(scope, receive, send)
            return
        lifecycle = self.access.lifecycle
        lifecycle.enter()
        account = key_context.current()
        if account is not None:
            account.inference = scope.get("method") == "POST"  # GETs read metadata: they are not usage
        try:
            if account is None:
                await self.app(scope, receive, send)
            else:
                await self._counted(scope, receive, send, account)
        finally:
            lifecycle.leave()

    async def _counted(self, scope: Scope, receive: Receive, send: Send, account: KeyAccount) -> None:
        """Run the request, then tell its key's usage how it ended (a status of 400 or more is an error)."""
        status = 500

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                extra = account.service.limiter.headers(account.key)  # the key's limits, as OpenAI's API says them
                if extra:
                    message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            account.finish(status)
