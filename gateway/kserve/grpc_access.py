"""The HTTP access checks on the gRPC service: the same `AccessControl` (drain, API keys, rate limits), with the
key read from the `authorization` metadata.

Health RPCs are public, the repository RPCs need the admin key, everything else an API key (when keys are
configured). A refused call ends with UNAUTHENTICATED, PERMISSION_DENIED, RESOURCE_EXHAUSTED or UNAVAILABLE before
the servicer runs. Callers without a key are rate-limited per address, found in the call's peer. An infer call made
with a named key counts in the key's usage, as an error if it fails.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from gateway.errors import SwitchyardError
from gateway.keys import context as key_context
from gateway.server.access import AccessControl

_STATUS = {
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


def peer_address(peer: str) -> str:
    """The caller's address in a gRPC peer string ("ipv4:10.0.0.7:5501", "ipv6:[::1]:5501", "unix:/run/s"),
    without the port: callers without a key get one rate-limit bucket per address, as on HTTP."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6" and rest.startswith("["):
        return rest[1 : rest.find("]")] if "]" in rest else rest
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    return peer


INFER_METHODS = ("ModelInfer", "ModelStreamInfer")  # what a key's usage counts (not metadata or readiness)


def _admitted(
    handler: grpc.RpcMethodHandler, admit: Callable[[str], object], infer: bool = True
) -> grpc.RpcMethodHandler:
    """The handler with `admit(peer address)` run first, inside the call (where the peer is known and the
    rate limiter's caller is bound for the call's task); a SwitchyardError ends the call with its status."""

    async def check(context: grpc.aio.ServicerContext) -> None:
        try:
            admit(peer_address(context.peer() or ""))
        except SwitchyardError as error:
            await context.abort(_STATUS.get(error.status, grpc.StatusCode.INVALID_ARGUMENT), error.message)
        account = key_context.current()
        if account is not None:
            account.inference = infer

    def finish(status: int) -> None:
        account = key_context.current()
        if account is not None:
            account.finish(status)

    kwargs = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.response_streaming:
        behavior = handler.stream_stream if handler.request_streaming else handler.unary_stream

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await check(context)
            status = 200  # a cancelled call is not an error
            try:
                async for response in behavior(request, context):
                    yield response
            except Exception:
                status = 500
                raise
            finally:
                finish(status)

        if handler.request_streaming:
            return grpc.stream_stream_rpc_method_handler(stream, **kwargs)
        return grpc.unary_stream_rpc_method_handler(stream, **kwargs)
    behavior = handler.stream_unary if handler.request_streaming else handler.unary_unary

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await check(context)
        status = 200
        try:
            return await behavior(request, context)
        except Exception:
            status = 500
            raise
        finally:
            finish(status)

    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, **kwargs)
    return grpc.unary_unary_rpc_method_handler(unary, **kwargs)


class AccessInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, access: AccessControl) -> None:
        self.access = access

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        role = self.access.keys.grpc_role(details.method)
        authorization = dict(details.invocation_metadata or ()).get("authorization")
        infer = details.method.rsplit("/", 1)[-1] in INFER_METHODS
        return _admitted(handler, lambda address: self.access.admit(role, authorization, address), infer)
